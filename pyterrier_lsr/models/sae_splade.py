"""SAE-SPLADE: a sparse autoencoder's latents in place of the wordpiece vocabulary (docs/sae-splade.md).

Stage 1 (:func:`pyterrier_lsr.train.train_token_sae`) trains a TopK SAE on the frozen backbone's L2-normalised token
states, with the SAE trainer and the cached token-state extraction Latent Terms uses.  Stage 2
(:class:`SaeSpladeModel`) drops the decoder and fine-tunes backbone + SAE encoder with the bundled loop; a text's
vector over latents ``j`` is

    ``v_j = α · w_j · log(1 + max_i relu(z_ij - θ_j))``,  ``z_i = relu(topk((x_i - b_dec) W_enc + b_enc))``,
    ``x_i = h_i / |h_i|``

so the loop's (and PISA's) dot product is ``α² <w log(1 + max z_q), w log(1 + max z_d)>`` with a learned scalar ``α``.

Choices (all fixed by the saved settings):

* **Special tokens** (``[CLS]``, ``[SEP]``, ``[PAD]``, ...; not ``[UNK]``, which stands for real text) take no part in
  the max: their states are alike in every text, so their latents would be posted in every document.  (Stage 1
  trains on all token states, special ones included; they are 2 of ~48 per Vaswani document.)
* **TopK stays on** at inference and in training: each token activates at most ``k`` latents, so vectors are sparse
  by construction (at most ``k x tokens`` non-zeros) before FLOPS regularization does anything.
* **α** starts at :data:`DEFAULT_ALPHA`, chosen so that the initial scores are on SPLADE's scale (see there).
* **θ**, a per-latent threshold on the TopK activations (FLOPS-aware latent selection), starts at 0 (plain TopK).
  TopK alone always fills k slots per token: a latent that FLOPS pushes down is replaced by the token's next-best
  one, so a stopword keeps k latents whatever the training does. Trained with FLOPS, θ rises for latents whose cost
  outweighs their use, and a token keeps only the latents above their thresholds (θ is used clamped at 0).
* **w**, a per-latent weight (used clamped at 0), starts at 1. TopK activations say how well a latent reconstructs a
  token, not how much it matters for retrieval, so a stopword's latents weigh as much as a rare word's; SPLADE's head
  learned that weighting, the SAE did not. :func:`latent_idf` sets w from the latents' document frequencies in an
  index (the query side of an :class:`~pyterrier_lsr.AsymmetricSplade`, so the index stays valid): latents in half
  the documents or more get 0 and drop out of queries, which also cuts the postings a query reads.
* The SAE's decoder is kept, frozen and unused: the saved ``sae/`` folder stays a complete SAE that
  :meth:`SparseAutoencoder.from_pretrained` reads (e.g. to compare latents before and after fine-tuning).

A model folder is the backbone's HF folder (our settings in ``config.json`` under ``lsr``, ``kind: sae-splade``) + the
tokenizer + ``sae/``; :meth:`SaeSplade.from_pretrained` rebuilds it exactly and
:func:`pyterrier_lsr.load_model` (hence ``LsrIndex(path).retriever()``) recognises it.
"""
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from ..core.checks import check_float, check_int
from ..core.model_files import load_hf_model, read_tensors
from .features import DenseFeatures
from .sae import SparseAutoencoder, latent_term_names
from .splade import CONFIG_KEY

KIND = 'sae-splade'
SAE_FOLDER = 'sae'
THRESHOLD_FILE = 'latent_threshold.safetensors'
WEIGHT_FILE = 'latent_weight.safetensors'
# Stage-1 latents of unit-norm token states are at most ~1, so log(1 + max z) lies in [0, 0.7] and with α = 1 scores
# are ~20x below SPLADE's.  Measured on 200 Vaswani training pairs (SPLADE-tiny backbone, 16,384 latents, k = 8):
# mean query-positive score 0.65 at α = 1 vs SPLADE-tiny's 14.7 (score spreads: 0.29 vs 6.4), i.e. α² ≈ 22.
DEFAULT_ALPHA = 4.7


def structural_token_ids(tokenizer) -> list[int]:
    """Special token ids whose positions take no part in pooling: all but ``[UNK]`` (which stands for real text)."""
    return sorted(set(tokenizer.all_special_ids) - {tokenizer.unk_token_id})


class SaeSpladeModel(nn.Module):
    """Backbone (HF ``AutoModel``) + SAE encoder + ``α``: ``(input_ids, attention_mask)`` -> ``batch x n_latents``.

    Args:
        backbone: an HF encoder returning ``last_hidden_state`` (e.g. ``BertForMaskedLM.bert``); fine-tuned.
        sae: a per-token TopK :class:`SparseAutoencoder` over this backbone's token states (``d_in`` = hidden size).
        skip_ids: token ids whose positions are not pooled (see :func:`structural_token_ids`).
        alpha: initial value of the learned scale.
        threshold: initial per-latent thresholds θ (default zeros).
        weight: initial per-latent weights w (default ones).
    """

    def __init__(self, backbone: nn.Module, sae: SparseAutoencoder, skip_ids: Sequence[int] = (),
                 alpha: float = DEFAULT_ALPHA, threshold: torch.Tensor | None = None,
                 weight: torch.Tensor | None = None):
        super().__init__()
        hidden = backbone.config.hidden_size
        if sae.config.d_in != hidden:
            raise ValueError(f'the SAE reads {sae.config.d_in}-d vectors but the backbone gives {hidden}-d token '
                             'states; train the SAE on this backbone (train_token_sae)')
        if sae.config.batch_topk:
            raise ValueError('SAE-SPLADE needs a per-token TopK SAE (batch_topk=False): each token keeps its k latents')
        self.features = DenseFeatures(backbone, 'multi', skip_ids=skip_ids, frozen=False)
        self.sae = sae
        sae.W_dec.requires_grad_(False)  # unused: only the encoder part is fine-tuned
        # α > 0: the weights are α log(1 + z); a negative α makes every weight negative and every vector empty
        self.alpha = nn.Parameter(torch.tensor(check_float('alpha', alpha, 0, exclusive_minimum=True)))
        self.latent_threshold = nn.Parameter(_per_latent('threshold', threshold, sae.n_latents, 0.))
        self.latent_weight = nn.Parameter(_per_latent('weight', weight, sae.n_latents, 1.))
        self.terms = latent_term_names(sae.n_latents)

    @property
    def backbone(self) -> nn.Module:
        return self.features.dense

    @property
    def vocab_size(self) -> int:
        return self.sae.n_latents

    @property
    def settings(self) -> dict:
        return {'kind': KIND, 'alpha': self.alpha.item(), 'pooling': 'log1p-max', 'special_tokens': 'excluded',
                'topk': 'per-token', 'sae': SAE_FOLDER, 'latent_threshold': THRESHOLD_FILE,
                'latent_weight': WEIGHT_FILE}

    def token_latents(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        """Each pooled token's top-k latents: ``(indices, values, owner)``, ``n x k``, ``n x k`` and ``n`` (its text),
        tokens in row-major (text, position) order over the non-skipped, non-padding positions; values are above
        their latents' thresholds (the others 0)."""
        vectors, owner = self.features(input_ids, attention_mask)
        indices, values = self.sae.encode_topk(vectors)
        return indices, (values - self.latent_threshold.clamp(min=0)[indices]).relu(), owner

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        indices, values, owner = self.token_latents(input_ids, attention_mask)
        n_latents = self.sae.n_latents
        # max_i z_ij per text without the dense tokens x latents tensor; z >= 0, so the zero start changes no maximum.
        flat = (owner[:, None] * n_latents + indices).flatten()
        pooled = values.new_zeros(len(input_ids) * n_latents).scatter_reduce(0, flat, values.flatten(), 'amax')
        return self.alpha * self.latent_weight.clamp(min=0) * torch.log1p(pooled.view(len(input_ids), n_latents))

    def save_pretrained(self, path, **kwargs):
        """The backbone's HF folder with our settings in ``config.json`` (``lsr``), and the SAE under ``sae/``."""
        path = Path(path)
        setattr(self.backbone.config, CONFIG_KEY, self.settings)
        self.backbone.save_pretrained(str(path), **kwargs)
        self.sae.save_pretrained(path / SAE_FOLDER)
        save_file({'threshold': self.latent_threshold.detach().cpu().contiguous()}, str(path / THRESHOLD_FILE))
        save_file({'weight': self.latent_weight.detach().cpu().contiguous()}, str(path / WEIGHT_FILE))

    @classmethod
    def from_pretrained(cls, path, skip_ids: Sequence[int] = ()) -> 'SaeSpladeModel':
        from transformers import AutoModel
        if not is_sae_splade_folder(path):
            raise ValueError(f'{path} is not an SAE-SPLADE folder (config.json has no {CONFIG_KEY}.kind = {KIND!r})')
        backbone, _ = load_hf_model(AutoModel, path, 'the SAE-SPLADE backbone')
        settings = getattr(backbone.config, CONFIG_KEY)
        sae = SparseAutoencoder.from_pretrained(Path(path) / settings['sae'])
        # folders written before θ or w existed have none: plain TopK and unit weights, as they were trained
        threshold, weight = (read_tensors(Path(path) / settings[key], [name])[name] if settings.get(key) else None
                             for key, name in (('latent_threshold', 'threshold'), ('latent_weight', 'weight')))
        return cls(backbone, sae, skip_ids, alpha=settings['alpha'], threshold=threshold, weight=weight)


def _per_latent(name: str, values: torch.Tensor | None, n_latents: int, default: float) -> torch.Tensor:
    if values is None:
        return torch.full((n_latents,), default)
    if values.shape != (n_latents,):
        raise ValueError(f'{name} must have one value per latent ({n_latents}), got shape {tuple(values.shape)}')
    return values.detach().float().clone()


def latent_idf(document_frequencies: Mapping[str, int], num_docs: int, terms: Sequence[str]) -> torch.Tensor:
    """Per-latent weights from document frequencies (``{term: df}``, e.g. ``LsrIndex.document_frequencies()``, over
    ``num_docs`` documents; ``terms``: the model's latent names): BM25's idf ``max(0, log((N - df + 0.5) / (df +
    0.5)))``, scaled so that their mean over the index's postings is 1 (an average posting keeps its score, so α and
    the training losses keep their scale). Latents in half the documents or more get 0; a latent absent from the
    index gets the largest idf (it costs nothing to read)."""
    num_docs = check_int('num_docs', num_docs, 1)
    df = torch.tensor([float(document_frequencies.get(t, 0)) for t in terms], dtype=torch.float64)
    if df.sum() <= 0:
        raise ValueError('document_frequencies has none of the model\'s latents: give the frequencies of an index '
                         'of this model')
    idf = torch.log((num_docs - df + 0.5) / (df + 0.5)).clamp(min=0)
    mean = (idf * df).sum() / df.sum()
    if mean <= 0:
        raise ValueError(f'every indexed latent is in at least half of the {num_docs} documents: no idf to weigh by')
    return (idf / mean).float()


def is_sae_splade_folder(path) -> bool:
    """Whether ``path`` holds an SAE-SPLADE model: its own folder, or an asymmetric model's whose sides are
    SAE-SPLADE models (the documents' model is then the folder's)."""
    config = Path(path) / 'config.json'
    settings = (json.loads(config.read_text()).get(CONFIG_KEY) or {}) if config.is_file() else {}
    return KIND in (settings.get('kind'), settings.get('sides'))
