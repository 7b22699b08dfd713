"""Jain & Wallace's reference model as a LightningModule: embedding -> encoder -> attention -> linear."""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence, Tuple, cast

import pytorch_lightning as pl
import torch
import torchmetrics
from torch import Tensor, nn

from lightning_xai.adapters.budget import PASS_BUDGET_ELEMENTS, budget_chunks
from lightning_xai.adapters.checks import check_token_ids
from lightning_xai.adapters.protocol import Batch, ExplainOutput, check_embeddings
from lightning_xai.attribution.targets import check_real_tokens
from lightning_xai.data.vocabulary import token_list
from lightning_xai.models.attention import build_attention, masked_softmax
from lightning_xai.models.embeddings import EmbeddingInitReport, check_embedding_init, initialize_embedding
from lightning_xai.models.encoders import LSTMEncoder, build_encoder
from lightning_xai.models.lstm_unrolled import deleted_hidden, deletion_reruns, lstm_states, supports_unrolling
from lightning_xai.models.steps import ClassifierSteps

__all__ = ["AttentionClassifier", "check_batch"]

# leave-one-out variants per chunk of deletion_logits' assembly: about this many hidden-state elements (4M: 16 MiB).
# Small on purpose: glibc raises its mmap threshold to the size of each freed mmapped block of up to 32 MiB, and
# blocks of that size then come from the heap, whose fragments stay resident; with 64 MiB chunks the peak RSS of
# one 2,000-token row grew chunk by chunk to 1.5 GiB, with 16 MiB chunks it stays at 0.36 GiB
# (benchmarks/bench_loo_memory.py)
_DELETION_CHUNK_ELEMENTS = 1 << 22
#: default memory budget of deletion_logits' rerun buffers, in elements (64M float32: 256 MiB): the budget of every
#: batched variant pass (:data:`~lightning_xai.adapters.budget.PASS_BUDGET_ELEMENTS`)
DELETION_BUDGET_ELEMENTS = PASS_BUDGET_ELEMENTS


def check_batch(batch: Batch, vocab_size: Optional[int] = None) -> None:
    """Raise a clear error for a batch the reference models cannot read (with ``vocab_size``: ids past the table).

    Example:
        >>> check_batch({"input_ids": torch.tensor([[3, 4]])})
        Traceback (most recent call last):
        ...
        KeyError: "Batch has no 'mask'; batches are dicts with 'input_ids', 'mask' and 'labels' (see TextClassificationDataModule)."
    """
    for key in ("input_ids", "mask"):
        if key not in batch:
            raise KeyError(
                f"Batch has no {key!r}; batches are dicts with 'input_ids', 'mask' and 'labels' "
                "(see TextClassificationDataModule)."
            )
    ids, mask = batch["input_ids"], batch["mask"]
    if mask.shape != ids.shape:
        raise ValueError(
            f"'mask' has shape {tuple(mask.shape)} but 'input_ids' has {tuple(ids.shape)}; they must match [B, T]."
        )
    check_real_tokens(mask, "batch['mask']")
    if vocab_size is not None:
        check_token_ids(ids, vocab_size, "batch['input_ids']")


def _rerun_groups(order: Tensor, costs: Tensor, max_elements: Optional[int]) -> List[Tuple[Tensor, Tensor]]:
    """Chunks of leave-one-out variants, as ``(variants, assembly order within them)``: consecutive variants of
    ``order`` whose rerun ``costs`` (elements each, in ``order``) sum to at most ``max_elements`` (at least one
    per chunk; :func:`~lightning_xai.adapters.budget.budget_chunks`); for ``None`` one chunk of all variants in their
    given order."""
    n = order.numel()
    if max_elements is None:
        return [(torch.arange(n, device=order.device), order)]
    return [
        (order[start:end], torch.arange(end - start, device=order.device))
        for start, end in budget_chunks(costs, max_elements)
    ]


class AttentionClassifier(ClassifierSteps, pl.LightningModule):
    """Text classifier with an inspectable attention layer, implementing the ExplainableModel protocol.

    Defaults follow Jain & Wallace (2019): embedding 300, BiLSTM with 128 units per direction, additive
    tanh attention, Adam (lr 1e-3, amsgrad, weight decay 1e-5 except on attention parameters).

    Args:
        vocab_size: number of rows of the embedding table (index 0 is the pad).
        num_classes: number of output classes.
        encoder: ``"bilstm"``, ``"lstm"``, ``"cnn"`` or ``"mlp"`` (Wiegreffe & Pinter's context-free diagnostic).
        attention: ``"tanh"`` (J&W additive), ``"dot"``, ``"linear"`` (Pruthi's Linear(2H, 1)) or ``"uniform"``.
        embedding_dim: size of the word vectors.
        hidden_dim: units per LSTM direction / MLP width.
        embedding_std: std of the normal embedding initialisation. PyTorch's default is 1.0; pretrained
            vectors have norms near 1-4, and the choice changes gradient-based saliency a lot (see README).
        embedding_init: where the word vectors start: ``"normal"`` (N(0, embedding_std²)), ``"file"``
            (``embeddings_path``: word2vec/GloVe text or a ``.pt`` {word: vector}) or ``"minilm"`` (the bundled
            MiniLM's word-piece embeddings averaged per word). See :mod:`lightning_xai.models.embeddings`.
            Sources need the vocabulary: applied at construction when ``vocab`` is given, else at
            ``on_fit_start`` (after ``setup`` copied the data module's vocabulary), once; never after weights
            were loaded (``load_state_dict``, ``load_from_checkpoint``, ``fit(ckpt_path=...)``), so restored
            weights are never overwritten and a restored model does not need the source.
        embeddings_path: the vector file for ``"file"`` (optional model directory for ``"minilm"``).
        embedding_rms: rescale the source vectors to this root-mean-square entry (fastText's is ~0.2);
            ``None`` keeps them as read.
        embedding_oov: rows the source lacks (incl. ``<unk>``/``<sos>``/``<eos>``): ``"zero"`` (as Jain &
            Wallace's loader) or ``"normal"`` (N(0, embedding_std²)).
        lr: Adam learning rate.
        weight_decay: L2 on every parameter except the attention scorer's.
        dropout: dropout on the embeddings (0 as in Jain & Wallace).
        objectives: extra training objectives; each is called ``objective(outputs, batch, model=self)`` and its
            value is added to the cross-entropy and logged under ``train/<name>``.
        vocab: the token list (saved in checkpoints so the model is reloadable without the data module).

    Example:
        >>> import torch
        >>> model = AttentionClassifier(vocab_size=20, num_classes=2, embedding_dim=8, hidden_dim=4)
        >>> batch = {"input_ids": torch.tensor([[3, 4, 5], [6, 7, 0]]),
        ...          "mask": torch.tensor([[True, True, True], [True, True, False]])}
        >>> out = model(batch)
        >>> out.logits.shape, bool(torch.allclose(out.attention.sum(-1), torch.ones(2)))
        (torch.Size([2, 2]), True)
    """

    def __init__(
        self,
        vocab_size: int,
        num_classes: int = 2,
        encoder: str = "bilstm",
        attention: str = "tanh",
        embedding_dim: int = 300,
        hidden_dim: int = 128,
        embedding_std: float = 1.0,
        lr: float = 1e-3,
        weight_decay: float = 1e-5,
        dropout: float = 0.0,
        objectives: Optional[Sequence[nn.Module]] = None,
        vocab: Optional[List[str]] = None,
        embedding_init: str = "normal",
        embeddings_path: Optional[str] = None,
        embedding_rms: Optional[float] = None,
        embedding_oov: str = "zero",
    ) -> None:
        super().__init__()
        if vocab_size < 2:
            raise ValueError(f"vocab_size must be at least 2 (pad + one token), got {vocab_size}.")
        if num_classes < 2:
            raise ValueError(f"num_classes must be at least 2, got {num_classes}.")
        self.save_hyperparameters(ignore=["objectives", "vocab"])
        self.vocab: Optional[List[str]] = list(vocab) if vocab is not None else None
        self.embedding = nn.Embedding(vocab_size, embedding_dim, padding_idx=0)
        nn.init.normal_(self.embedding.weight, std=embedding_std)
        with torch.no_grad():
            self.embedding.weight[0].zero_()
        check_embedding_init(embedding_init, embeddings_path, embedding_oov, embedding_rms)
        self.embedding_init_report: Optional[EmbeddingInitReport] = None
        self._embedding_init_done = embedding_init == "normal"
        if self.vocab is not None:
            self._init_embedding_from_source()
        self.dropout = nn.Dropout(dropout)
        self.encoder = build_encoder(encoder, embedding_dim, hidden_dim)
        self.attention = build_attention(attention, self.encoder.output_dim)
        self.classifier = nn.Linear(self.encoder.output_dim, num_classes)
        self.objectives = nn.ModuleList(objectives or [])
        metrics = lambda: torchmetrics.MetricCollection(
            {  # noqa: E731
                "acc": torchmetrics.Accuracy(task="multiclass", num_classes=num_classes),
                "f1": torchmetrics.F1Score(task="multiclass", num_classes=num_classes, average="macro"),
                "auroc": torchmetrics.AUROC(task="multiclass", num_classes=num_classes),  # J&W select on dev ROC-AUC
            }
        )
        self.val_metrics = metrics().clone(prefix="val/")
        self.test_metrics = metrics().clone(prefix="test/")

    # --- the ExplainableModel protocol -------------------------------------------------------------
    def embed(self, batch: Batch) -> Tensor:
        check_batch(batch, self.embedding.num_embeddings)
        return self.embedding(batch["input_ids"])

    def token_mask(self, batch: Batch) -> Tensor:
        if "mask" not in batch:
            check_batch(batch)  # the clear message, not a bare KeyError
        return batch["mask"]

    def input_mask(self, batch: Batch) -> Tensor:
        """``[B, T]`` positions the encoder reads: real tokens plus special ones such as ``<SOS>``/``<EOS>``."""
        return batch.get("input_mask", batch["mask"])

    def forward_from_embeddings(
        self, embeddings: Tensor, batch: Batch, *, attention_override: Optional[Tensor] = None
    ) -> ExplainOutput:
        mask = self.token_mask(batch)
        check_embeddings(embeddings, mask)
        hidden = self.encoder(self.dropout(embeddings), self.input_mask(batch))
        return self._pool_and_classify(hidden, mask, attention_override)

    def _pool_and_classify(
        self, hidden: Tensor, mask: Tensor, attention_override: Optional[Tensor] = None
    ) -> ExplainOutput:
        """Everything after the encoder: attention over the real tokens, the context vector, the logits."""
        scores = self.attention(hidden).masked_fill(~mask, float("-inf"))
        if attention_override is None:
            attention = masked_softmax(scores, mask)
        else:
            if attention_override.shape != mask.shape:
                raise ValueError(
                    f"attention_override has shape {tuple(attention_override.shape)}; "
                    f"expected the token mask's {tuple(mask.shape)}."
                )
            # Positions outside the token mask are not attendable: they contribute nothing.
            attention = attention_override.masked_fill(~mask, 0.0).to(hidden.dtype)
        context = torch.einsum("bt,bth->bh", attention, hidden)
        logits = self.classifier(context)
        return ExplainOutput(
            logits=logits,
            attention=attention,
            hidden_states=hidden,
            attention_scores=scores,
            extras={"context": context},
        )

    def deletion_logits(
        self,
        embeddings: Tensor,
        batch: Batch,
        rows: Tensor,
        positions: Tensor,
        max_elements: Optional[int] = DELETION_BUDGET_ELEMENTS,
    ) -> Optional[Tensor]:
        """``[N, C]`` logits of row ``rows[k]`` with token ``positions[k]`` deleted (the optional fast path of
        the ExplainableModel protocol that :func:`~lightning_xai.attribution.leave_one_out` uses).

        A (Bi)LSTM encoder reuses the full rows' recurrent states (:mod:`lightning_xai.models.lstm_unrolled`):
        about a sixth of the LSTM multiply-adds of re-running the model on every shortened row (twice as fast
        overall), the same logits up to float rounding. Returns ``None`` — run the model on the shortened rows
        instead — for other encoders, in training mode (dropout), when gradients are enabled and off the CPU
        (cuDNN runs the shortened rows well).

        The reruns of a variant of a row of length L hold (L − 1) × hidden_dim floats, Σ_b L_b² × H in all (2 GiB
        for one 2,000-token row of the reference BiLSTM): the variants run in chunks whose rerun buffers hold at
        most ``max_elements`` elements (at least one variant per chunk; default 64M floats, 256 MiB; see
        benchmarks/bench_loo_memory.py). ``None``: all variants in one buffer (the pre-budget path; the same
        logits up to float rounding).

        Example:
            >>> model = AttentionClassifier(vocab_size=20, num_classes=2, embedding_dim=8, hidden_dim=4).eval()
            >>> batch = {"input_ids": torch.tensor([[3, 4, 5]]), "mask": torch.ones(1, 3, dtype=torch.bool)}
            >>> with torch.no_grad():
            ...     fast = model.deletion_logits(model.embed(batch), batch, torch.tensor([0]), torch.tensor([1]))
            ...     short = {"input_ids": torch.tensor([[3, 5]]), "mask": torch.ones(1, 2, dtype=torch.bool)}
            ...     slow = model(short).logits
            >>> bool(torch.allclose(fast, slow, atol=1e-6))
            True
        """
        if (
            self.training
            or torch.is_grad_enabled()
            or embeddings.device.type != "cpu"
            or not isinstance(self.encoder, LSTMEncoder)
            or not supports_unrolling(self.encoder.rnn)
        ):
            return None
        rnn = self.encoder.rnn
        mask = self.token_mask(batch)
        T = mask.shape[1]
        lengths = self.input_mask(batch).sum(1)
        states = lstm_states(rnn, embeddings, lengths)
        # shortest variants first, so that each chunk is only as wide as its longest shortened row
        order = torch.argsort(lengths.index_select(0, rows), stable=True)
        chunk = max(1, _DELETION_CHUNK_ELEMENTS // max(1, T * self.encoder.output_dim))
        pieces = [embeddings.new_zeros(0, self.classifier.out_features)]
        # a variant reruns L − 1 steps of hidden_size in all (i before the deleted token, L − 1 − i after it)
        costs = (lengths.index_select(0, rows.index_select(0, order)) - 1) * rnn.hidden_size
        for group, assembly in _rerun_groups(order, costs, max_elements):
            g_rows, g_positions = rows.index_select(0, group), positions.index_select(0, group)
            reruns = deletion_reruns(rnn, states, g_rows, g_positions)
            for start in range(0, assembly.numel(), chunk):
                k = assembly[start : start + chunk]
                r, p = g_rows.index_select(0, k), g_positions.index_select(0, k)
                width = max(1, int(lengths.index_select(0, r).max()) - 1)
                hidden = deleted_hidden(states, reruns, g_rows, g_positions, variants=k, width=width)
                # the token mask without the deleted position: new position j reads old j, or j + 1 from p on
                keep = torch.arange(width, device=mask.device).unsqueeze(0)
                short_mask = mask.index_select(0, r).gather(1, keep + (keep >= p.unsqueeze(1)))
                pieces.append(self._pool_and_classify(hidden, short_mask).logits)
            del reruns
        back = torch.empty_like(order)
        back[order] = torch.arange(order.numel(), device=order.device)
        return torch.cat(pieces).index_select(0, back)  # cat promotes under autocast (bf16 logits)

    def forward(self, batch: Batch, attention_override: Optional[Tensor] = None) -> ExplainOutput:
        return self.forward_from_embeddings(self.embed(batch), batch, attention_override=attention_override)

    # --- optional capabilities (lightning_xai.adapters.capabilities) --------------------------------
    def linear_head(self) -> nn.Linear:
        """:class:`~lightning_xai.adapters.capabilities.LinearHead`: logits = classifier(Σ_t α_t h_t)."""
        return self.classifier

    def token_encoder(self) -> nn.Module:
        """:class:`~lightning_xai.adapters.capabilities.TokenEncoder`: hidden states = encoder(embeddings, input mask)."""
        return self.encoder

    def embedding_table(self) -> Tensor:
        """:class:`~lightning_xai.adapters.capabilities.EmbeddingShift`: the ``[V, E]`` embedding table."""
        return self.embedding.weight

    def embedding_shift_refusal(self) -> Optional[str]:
        """Why :meth:`shift_embeddings` cannot compensate a shift in this encoder (``None``: it can)."""
        if callable(getattr(self.encoder, "compensate_input_shift", None)):
            return None
        return (
            f"Cannot compensate an embedding shift in {type(self.encoder).__name__}: supported "
            "encoders are LSTMEncoder ('lstm', 'bilstm'), OrthogonalLSTMEncoder ('ortho_lstm', "
            "'ortho_bilstm') and MLPEncoder ('mlp'). The CNN zero-pads its borders, so a shifted "
            "input is not a bias change there."
        )

    def shift_embeddings(self, shift: Tensor) -> None:
        """:class:`~lightning_xai.adapters.capabilities.EmbeddingShift`: add ``shift`` ``[E]`` to every embedding
        (the pad row too) and subtract ``W·shift`` from the bias of the encoder's first layer, in place.

        Example:
            >>> model = AttentionClassifier(vocab_size=20, num_classes=2, embedding_dim=8, hidden_dim=4).eval()
            >>> batch = {"input_ids": torch.tensor([[3, 4, 5]]), "mask": torch.ones(1, 3, dtype=torch.bool)}
            >>> before = model(batch).logits
            >>> model.shift_embeddings(torch.full((8,), 0.5))
            >>> torch.allclose(model(batch).logits, before, atol=1e-5)
            True
        """
        refusal = self.embedding_shift_refusal()
        if refusal is not None:
            raise ValueError(refusal)
        compensate = cast(Callable[[Tensor], None], self.encoder.compensate_input_shift)
        with torch.no_grad():
            shift = shift.to(self.embedding.weight)
            compensate(shift)  # first: a refusal leaves the model unchanged
            self.embedding.weight.add_(shift)

    # --- training --------------------------------------------------------------------------------------
    def configure_optimizers(self) -> torch.optim.Optimizer:
        attention_params = {id(p) for p in self.attention.parameters()}
        decayed = [p for p in self.parameters() if id(p) not in attention_params]
        groups = [
            {"params": decayed, "weight_decay": self.hparams["weight_decay"]},
            {"params": list(self.attention.parameters()), "weight_decay": 0.0},
        ]
        return torch.optim.Adam([g for g in groups if g["params"]], lr=self.hparams["lr"], amsgrad=True)

    # --- the vocabulary travels with the checkpoint ------------------------------------------------------
    def setup(self, stage: str) -> None:
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        if self.vocab is None and datamodule is not None and getattr(datamodule, "vocab", None) is not None:
            self.vocab = token_list(datamodule.vocab)  # a Vocabulary, a list, or a dict either way round

    def on_fit_start(self) -> None:
        # After setup() copied the vocabulary and after Lightning restored any checkpoint (which marks the
        # embedding as loaded), so a resumed run keeps its weights and never needs the source again.
        self._init_embedding_from_source()

    def _init_embedding_from_source(self) -> None:
        """Fill the embedding table from ``embedding_init``'s source once, before any training."""
        if self._embedding_init_done or self.vocab is None:
            return
        hp = self.hparams
        self.embedding_init_report = initialize_embedding(
            self.embedding,
            self.vocab,
            hp["embedding_init"],
            path=hp["embeddings_path"],
            std=hp["embedding_std"],
            oov=hp["embedding_oov"],
            rms=hp["embedding_rms"],
        )
        self._embedding_init_done = True

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        self._embedding_init_done = True  # loaded weights win over any initialisation source
        super()._load_from_state_dict(*args, **kwargs)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["lightning_xai_vocab"] = self.vocab

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.vocab = checkpoint.get("lightning_xai_vocab", self.vocab)
        self._embedding_init_done = True
