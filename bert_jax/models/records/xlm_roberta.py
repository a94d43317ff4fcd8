"""CamemBERT (Martin et al. 2020) and XLM-RoBERTa (Conneau et al. 2020), one module registering both: RoBERTa with
a SentencePiece vocabulary (named to load after records/roberta.py, whose record they copy).

Both are fairseq RoBERTas, in HF's Camembert* and XLMRoberta* classes: RoBERTa's network and parameter
names (records/roberta.py's layout, "roberta." inside the head classes), and a SentencePiece model laid
out as fairseq's dictionary (data_pipelines/fairseq_spm.py): CamemBERT's
`<s>NOTUSED <pad> </s>NOTUSED <unk>` and then the model's pieces (`<s>` = 5, `</s>` = 6), XLM-R's
`<s> <pad> </s> <unk>` and then the pieces one id up; `<mask>` last in both. Cased, no ALBERT preprocessing.
"""
from __future__ import annotations

import dataclasses
import functools

from bert_jax.errors import UserError
from bert_jax.models import families
from bert_jax.models.config import ModelConfig
from bert_jax.models.families import Architecture
from bert_jax.models.records import bert_layout as bl
from bert_jax.models.records import roberta

# family name, HF model_type, HF class prefix, tokenizer kind, HF tokenizer class, (bos, eos) ids
_VARIANTS = (("camembert", "camembert", "Camembert", "camembert_spm", "CamembertTokenizer", (5, 6)),
             ("xlm-roberta", "xlm-roberta", "XLMRoberta", "xlmr_spm", "XLMRobertaTokenizer", (0, 2)))


def _write_hf_config(config: ModelConfig, bos_eos: tuple[int, int]) -> dict:
  if config.mlm_head and config.hidden_act != "gelu":
    raise UserError(f"RoBERTa's HF MLM head hard-codes GELU; this model uses {config.hidden_act}")
  return bl.write_hf_config(config, bos_token_id=bos_eos[0], eos_token_id=bos_eos[1])


def _family(name: str, model_type: str, prefix: str, tokenizer: str, tokenizer_class: str,
            bos_eos: tuple[int, int]) -> families.Family:
  base = roberta.FAMILY
  hf = dataclasses.replace(
      base.hf, model_type=model_type, class_prefix=prefix,
      architectures=(Architecture(f"{prefix}ForMaskedLM", frozenset({"mlm"}), True),
                     Architecture(f"{prefix}Model", frozenset({"pooler"}), False)),
      read_config=functools.partial(bl.read_hf_config, with_heads=roberta.with_heads, defaults={"pad_token_id": 1},
                                    gelu_mlm=name, position_style="roberta", family=name),
      write_config=functools.partial(_write_hf_config, bos_eos=bos_eos),
      tokenizer_class=tokenizer_class,
      tokenizer_settings=dict(bos_token="<s>", eos_token="</s>", unk_token="<unk>", sep_token="</s>",
                              cls_token="<s>", pad_token="<pad>", mask_token="<mask>"),
      lower_case=False)
  # Houlsby adapters export only to the classes conversion/hf_adapter_modeling.py writes (BERT's, RoBERTa's)
  layout = dataclasses.replace(base.layout, adapter_rows=())
  return families.register(dataclasses.replace(base, name=name, tokenizer=tokenizer, layout=layout, hf=hf))


CAMEMBERT, XLM_ROBERTA = (_family(*variant) for variant in _VARIANTS)
