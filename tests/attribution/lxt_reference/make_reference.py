"""Reference maps for tests/attribution/test_attnlrp.py from LXT's own efficient AttnLRP (not a project dependency).

LXT 2.1 (github.com/rachtibat/LRP-eXplains-Transformers) patches transformers 4.51's modeling files, so it runs in a
separate environment that sees the project's torch but an older transformers:

    python3 -m venv /tmp/lxtenv
    echo "$(.venv/bin/python -c 'import site; print(site.getsitepackages()[0])')" \
        > "$(/tmp/lxtenv/bin/python -c 'import site; print(site.getsitepackages()[0])')/project.pth"
    /tmp/lxtenv/bin/pip install --no-deps lxt==2.1 zennit tabulate && /tmp/lxtenv/bin/pip install transformers==4.51.3
    /tmp/lxtenv/bin/python tests/attribution/lxt_reference/make_reference.py

It saves, for a seeded tiny BERT and Llama classifier (float64, eval), the weights, the input ids, the logits and
LXT's token relevance of logit 1 (gradient x input at the word embeddings after ``lxt`` patched the modules).
``lxt.efficient``'s package ``__init__`` imports its torchvision ViT patch; torchvision is not needed for BERT or
Llama, so the two model patches are imported on their own.
"""

import importlib
import os
import sys
import types

import lxt

pkg = types.ModuleType("lxt.efficient")  # skip lxt.efficient/__init__ (imports torchvision's ViT); load its parts
pkg.__path__ = [os.path.join(os.path.dirname(lxt.__file__), "efficient")]
sys.modules["lxt.efficient"] = pkg
models = types.ModuleType("lxt.efficient.models")
models.__path__ = [os.path.join(pkg.__path__[0], "models")]
sys.modules["lxt.efficient.models"] = models
import torch
import transformers

print("transformers", transformers.__version__, "torch", torch.__version__)
llama = importlib.import_module("lxt.efficient.models.llama")
bert = importlib.import_module("lxt.efficient.models.bert")
for target, patch in {**llama.attnLRP, **bert.attnLRP}.items():
    assert patch(target) is not False, target
from transformers.models.bert import modeling_bert
from transformers.models.llama import modeling_llama

out = {}
ids = torch.tensor([[2, 7, 8, 11, 5, 9, 3], [2, 13, 4, 6, 17, 21, 3]])
for name in ("bert", "llama"):
    torch.manual_seed(0)
    if name == "bert":
        cfg = transformers.BertConfig(
            vocab_size=30,
            hidden_size=16,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=32,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            attn_implementation="eager",
        )
        model = modeling_bert.BertForSequenceClassification(cfg)
        kw = {"token_type_ids": torch.zeros_like(ids)}
    else:
        cfg = transformers.LlamaConfig(
            vocab_size=30,
            hidden_size=16,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=32,
            pad_token_id=0,
            attn_implementation="eager",
        )
        model = modeling_llama.LlamaForSequenceClassification(cfg)
        kw = {}
    model = model.double().eval()
    emb = model.get_input_embeddings()(ids).detach().requires_grad_(True)
    logits = model(inputs_embeds=emb, attention_mask=torch.ones_like(ids), **kw).logits
    logits[:, 1].sum().backward()
    out[name] = {
        "state": {k: v.clone() for k, v in model.state_dict().items()},
        "ids": ids,
        "logits": logits.detach(),
        "relevance": (emb * emb.grad).sum(-1).detach(),
        "config": cfg.to_dict(),
    }
    print(name, "logit", logits[:, 1].tolist(), "sum R", out[name]["relevance"].sum(-1).tolist())
torch.save(out, os.path.join(os.path.dirname(os.path.abspath(__file__)), "attnlrp_lxt.pt"))
