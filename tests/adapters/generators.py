"""The tiny random generators of the generation tests (issue #31) and the oracles they are checked against: causal
LMs (Llama, Qwen2, GPT-2) and encoder–decoders (BART, Marian, T5, a bert2bert ``EncoderDecoderModel``), float64,
padded batches, and by-hand source masks, log-probabilities and gradients from the models' own forward passes."""

from __future__ import annotations

import torch

CAUSAL = ("llama", "qwen2", "gpt2")
SEQ2SEQ = ("bart", "marian", "t5", "encoder_decoder")


def causal_lm(family: str, seed: int = 0, attn_implementation: str = "eager"):
    """A random causal LM (vocab 40: pad 0, bos 1, eos 2), float64, eval."""
    import transformers as tf

    torch.manual_seed(seed)
    common = dict(
        vocab_size=40, pad_token_id=0, bos_token_id=1, eos_token_id=2, attn_implementation=attn_implementation
    )
    if family == "gpt2":
        config = tf.GPT2Config(
            n_embd=16,
            n_layer=2,
            n_head=4,
            n_positions=32,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            initializer_range=0.2,
            **common,
        )
        model = tf.GPT2LMHeadModel(config)
    else:
        config_cls, model_cls = {
            "llama": (tf.LlamaConfig, tf.LlamaForCausalLM),
            "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM),
        }[family]
        config = config_cls(
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=32,
            initializer_range=0.2,
            **common,
        )
        model = model_cls(config)
    return model.double().eval()


def seq2seq(family: str, seed: int = 0, attn_implementation: str = "eager"):
    """A random encoder–decoder (vocab 40), float64, eval; Marian scales its embeddings (scale_embedding=True); T5
    (relative position bias, unscaled dot products, pad 0 = decoder start, no bos); a BERT encoder + BERT decoder
    ``EncoderDecoderModel`` (``[CLS]`` 1 starts decoding, ``[SEP]`` 2 ends, pad 0)."""
    import transformers as tf

    torch.manual_seed(seed)
    if family == "t5":
        config = tf.T5Config(
            vocab_size=40,
            d_model=16,
            d_kv=4,
            d_ff=32,
            num_layers=2,
            num_decoder_layers=2,
            num_heads=4,
            relative_attention_num_buckets=8,
            relative_attention_max_distance=16,
            dropout_rate=0.0,
            initializer_factor=1.0,
            pad_token_id=0,
            eos_token_id=1,
            decoder_start_token_id=0,
            attn_implementation=attn_implementation,
        )
        return tf.T5ForConditionalGeneration(config).double().eval()
    if family == "encoder_decoder":
        bert = dict(
            vocab_size=40,
            hidden_size=16,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=32,
            max_position_embeddings=32,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            initializer_range=0.2,
            pad_token_id=0,
            attn_implementation=attn_implementation,
        )
        config = tf.EncoderDecoderConfig.from_encoder_decoder_configs(
            tf.BertConfig(**bert), tf.BertConfig(is_decoder=True, add_cross_attention=True, **bert)
        )
        config.decoder_start_token_id, config.pad_token_id, config.eos_token_id = 1, 0, 2
        model = tf.EncoderDecoderModel(config=config)  # (it builds its halves on its own default implementation)
        model.set_attn_implementation(attn_implementation)
        return model.double().eval()
    common = dict(
        vocab_size=40,
        d_model=16,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=32,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        init_std=0.2,
        attn_implementation=attn_implementation,
    )
    if family == "bart":
        model = tf.BartForConditionalGeneration(
            tf.BartConfig(pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2, **common)
        )
    else:
        model = tf.MarianMTModel(
            tf.MarianConfig(pad_token_id=3, eos_token_id=2, decoder_start_token_id=3, scale_embedding=True, **common)
        )
    return model.double().eval()


def causal_batch():
    """Right-padded: row 0 prompt <bos> 5 6 7 8, target 9 10; row 1 prompt <bos> 11 12, target 13 14, two pads."""
    input_ids = torch.tensor([[1, 5, 6, 7, 8, 9, 10], [1, 11, 12, 13, 14, 0, 0]])
    labels = torch.tensor([[-100] * 5 + [9, 10], [-100, -100, -100, 13, 14, -100, -100]])
    return {"input_ids": input_ids, "attention_mask": (input_ids != 0).long(), "labels": labels}


def seq2seq_batch(family: str):
    """Source and target as wide (5), so a target that followed the source's tokens would be cut: row 1 is padded."""
    eos = 1 if family == "t5" else 2
    if family == "bart":  # <s>=0 ... </s>=2, pad 1
        input_ids, pad = torch.tensor([[0, 5, 6, 7, 2], [0, 8, 9, 2, 1]]), 1
    elif family == "marian":  # </s>=2, pad 3
        input_ids, pad = torch.tensor([[5, 6, 7, 8, 2], [9, 10, 2, 3, 3]]), 3
    elif family == "t5":  # no bos, </s>=1, pad 0
        input_ids, pad = torch.tensor([[5, 6, 7, 8, 1], [9, 10, 1, 0, 0]]), 0
    else:  # bert2bert: [CLS]=1 ... [SEP]=2, pad 0
        input_ids, pad = torch.tensor([[1, 5, 6, 7, 2], [1, 8, 9, 2, 0]]), 0
    labels = torch.tensor([[11, 12, 13, 14, eos], [15, 16, eos, -100, -100]])
    return {"input_ids": input_ids, "attention_mask": (input_ids != pad).long(), "labels": labels}


def make(family: str, **kwargs):
    if family in CAUSAL:
        return causal_lm(family, **kwargs), causal_batch()
    return seq2seq(family, **kwargs), seq2seq_batch(family)


def source_mask(model, batch) -> torch.Tensor:
    """The positions explained, by hand: non-pad, non-special, and (causal) before the row's first target."""
    config = model.config
    special = torch.tensor(
        [
            i
            for i in (
                getattr(config, name, None)
                for name in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id")
            )
            if i is not None
        ]
    )
    mask = batch["attention_mask"].bool() & ~torch.isin(batch["input_ids"], special)
    if not config.is_encoder_decoder:
        mask &= (batch["labels"] != -100).long().cumsum(1) == 0
    return mask


def own_log_probs(model, batch, inputs_embeds=None) -> torch.Tensor:
    """``[B]`` Σ log p(target) from the model's own forward (transformers' shift for causal LMs), by hand."""
    labels = batch["labels"]
    kwargs = {"attention_mask": batch["attention_mask"]}
    kwargs.update({"inputs_embeds": inputs_embeds} if inputs_embeds is not None else {"input_ids": batch["input_ids"]})
    if model.config.is_encoder_decoder:
        kwargs["decoder_input_ids"] = model.prepare_decoder_input_ids_from_labels(labels=labels)
        logits, targets = model(**kwargs).logits, labels
    else:
        logits, targets = model(**kwargs).logits[:, :-1], labels[:, 1:]
    picked = logits.log_softmax(-1).gather(-1, targets.clamp_min(0)[..., None]).squeeze(-1)
    return (picked * (targets != -100)).sum(-1)


def hand_gradient(model, batch) -> torch.Tensor:
    """``[B, T, E]``: ∂ Σ log p(target) / ∂ (the encoder's input word embeddings), through the model's own forward."""
    module = (
        model.get_encoder().get_input_embeddings() if model.config.is_encoder_decoder else model.get_input_embeddings()
    )
    taken = []

    def hook(_, __, output):
        if taken:  # Marian shares the table with its decoder: the encoder's lookup runs first
            return output
        taken.append(output.detach().requires_grad_(True))
        return taken[0]

    handle = module.register_forward_hook(hook)
    try:
        score = own_log_probs(model, batch).sum()
    finally:
        handle.remove()
    (grad,) = torch.autograd.grad(score, taken[0])
    return grad, taken[0].detach()
