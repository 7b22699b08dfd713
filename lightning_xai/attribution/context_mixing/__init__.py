"""Context-mixing explanations of transformer classifiers seen through ``HuggingFaceAdapter``.

Raw attention ignores what the weights multiply (value vectors), the residual stream and the layer norms. These
methods account for them; each returns the classifier's summary row (``[CLS]`` for the BERT family) over the tokens:

============================  ==========================================  ==============================
method                        source                                      families
============================  ==========================================  ==============================
``"attention_norm"``          Kobayashi et al. 2020 (EMNLP)               BERT family, DistilBERT, Llama
``"value_zeroing"``           Mohebbi et al. 2023 (EACL)                  BERT family, DistilBERT, Llama
``"alti"``                    Ferrando et al. 2022 (EMNLP)                BERT family, DistilBERT, Llama
``"attention_flow"``          Abnar & Zuidema 2020 (ACL)                  any eager-attention family
``"grad_attention"``          Chefer et al. 2021 (ICCV)                   any eager-attention family; causal LMs
``"attnlrp"``                 Achtibat et al. 2024 (ICML)                 BERT family, DistilBERT, Llama
============================  ==========================================  ==============================

(BERT family: BERT, RoBERTa, MiniLM, ELECTRA and other ``BertLayer``-shaped encoders; Llama family: Llama, Qwen2,
Mistral and other ``LlamaDecoderLayer``-shaped decoders.) Importing this package registers the methods with
:func:`lightning_xai.attribution.attribute`.
"""

from lightning_xai.attribution.context_mixing.alti import alti
from lightning_xai.attribution.context_mixing.attention_norm import attention_norm
from lightning_xai.attribution.context_mixing.attnlrp import attnlrp
from lightning_xai.attribution.context_mixing.flow import attention_flow, max_flow_value
from lightning_xai.attribution.context_mixing.grad_attention import grad_attention
from lightning_xai.attribution.context_mixing.value_zeroing import value_zeroing

__all__ = ["alti", "attention_flow", "attnlrp", "attention_norm", "grad_attention", "max_flow_value", "value_zeroing"]
