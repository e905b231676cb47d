"""ColBERT-style multi-vector encoder and MaxSim late interaction, in plain torch.

A text's token embeddings are ``e_i = normalize(P h_i)``: a linear projection ``P`` (``hidden -> dim``, no bias) of
the backbone's token states, L2-normalised, one per scored token.  Scored tokens are the non-padding positions that
are not structural special tokens (``[CLS]``, ``[SEP]``, ...; ``[UNK]`` stands for real text and is kept).

MaxSim (Khattab & Zaharia, 2020): ``s(q, d) = sum_i max_j <q_i, d_j>`` over the query's and document's scored tokens.
A document without scored tokens scores 0.

Our choices where ColBERT differs (documented, not tuned): no ``[Q]``/``[D]`` marker tokens and no ``[MASK]`` query
augmentation (the backbone, all-MiniLM-L6-v2, has no such embeddings trained), punctuation is kept.

A model folder is the backbone's HF folder + ``projection.safetensors`` + ``multivector.json`` (our settings);
the wrapper (:class:`pyterrier_lsr.kinds.multivector.MultiVector`) adds the tokenizer.
"""
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

# The shared token-state extraction of Latent Terms and SAE-SPLADE (normalised token states + their mask).
from ..core import storage
from ..core.checks import check_int
from ..core.model_files import load_hf_model, read_tensors
from .features import DenseFeatures

KIND = 'multivector'
SETTINGS_FILE = 'multivector.json'
PROJECTION_FILE = 'projection.safetensors'


def maxsim(q: torch.Tensor, q_mask: torch.Tensor, d: torch.Tensor, d_mask: torch.Tensor) -> torch.Tensor:
    """All-pairs MaxSim: ``q`` (Q x Lq x dim), ``d`` (D x Ld x dim) with boolean masks -> Q x D scores.

    Masked query tokens contribute 0; a document's masked tokens are never the max; a document with no scored token
    scores 0.
    """
    sims = torch.einsum('qid,njd->qnij', q, d)
    sims = sims.masked_fill(~d_mask[None, :, None, :], float('-inf')).amax(-1)
    sims = sims.masked_fill(~q_mask[:, None, :] | ~d_mask.any(-1)[None, :, None], 0.)
    return sims.sum(-1)


def maxsim_infonce(q: torch.Tensor, q_mask: torch.Tensor, d: torch.Tensor, d_mask: torch.Tensor,
                   candidates: int, temperature: float = 1.) -> torch.Tensor:
    """InfoNCE over MaxSim scores with in-batch negatives: query ``b``'s positive is document ``b * candidates`` (each
    query brings its positive then ``candidates - 1`` hard negatives); every other document of the batch is a
    negative."""
    scores = maxsim(q, q_mask, d, d_mask)
    target = torch.arange(len(q), device=q.device) * candidates
    return F.cross_entropy(scores / temperature, target)


class MultiVectorModel(nn.Module):
    """Backbone (HF ``AutoModel``) + projection: ``(input_ids, attention_mask) -> (embeddings, mask)``, embeddings
    ``batch x length x dim`` (L2-normalised, zero where masked), mask ``batch x length`` (scored tokens)."""

    def __init__(self, backbone: nn.Module, dim: int = 128, skip_ids: Sequence[int] = (),
                 projection: torch.Tensor | None = None, seed: int = 0):
        super().__init__()
        self.features = DenseFeatures(backbone, mode='multi', skip_ids=skip_ids, frozen=False)
        self.dim = check_int('dim', dim, 1)  # 0 would embed every token as the empty vector: every score 0
        self.skip_ids = sorted(int(i) for i in skip_ids)
        self.projection = nn.Linear(self.features.dim, dim, bias=False)
        with torch.no_grad():
            if projection is not None:
                self.projection.weight.copy_(projection)
            else:
                # Orthogonal rows keep the token states' angles roughly intact, so the untrained encoder already
                # scores like MaxSim over (normalised) backbone states.
                nn.init.orthogonal_(self.projection.weight, generator=torch.Generator().manual_seed(seed))

    @property
    def backbone(self) -> nn.Module:
        return self.features.dense

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        vectors, _ = self.features(input_ids, attention_mask)
        mask = self.features.token_mask(input_ids, attention_mask)
        out = vectors.new_zeros(*mask.shape, self.dim)
        out[mask] = F.normalize(self.projection(vectors), dim=-1)
        return out, mask

    @property
    def settings(self) -> dict:
        return {'kind': KIND, 'dim': self.dim, 'skip_ids': self.skip_ids}

    def save_pretrained(self, path):
        """Backbone HF folder + ``projection.safetensors`` + ``multivector.json``, each file written atomically."""
        from safetensors.torch import save_file
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.backbone.save_pretrained(str(path))
        weight = self.projection.weight.detach().contiguous().cpu()
        storage.write_file(path / PROJECTION_FILE, lambda tmp: save_file({'weight': weight}, str(tmp)))
        storage.write_json(path / SETTINGS_FILE, self.settings)

    @classmethod
    def from_pretrained(cls, path) -> 'MultiVectorModel':
        from transformers import AutoModel
        path = Path(path)
        settings = storage.read_json(path / SETTINGS_FILE, 'multi-vector settings')
        if settings.get('kind') != KIND:
            raise ValueError(f'{path} holds a {settings.get("kind")!r} model, not {KIND!r}')
        skip_ids = settings.get('skip_ids')
        try:
            check_int('dim', settings.get('dim'), 1)
            if not isinstance(skip_ids, list):
                raise TypeError(f'skip_ids must be a list of token ids, got {skip_ids!r:.40}')
            for i in skip_ids:
                check_int('skip_ids', i, 0)
        except (TypeError, ValueError) as ex:
            raise ValueError(f'{path / SETTINGS_FILE}: {ex}') from None
        projection = read_tensors(path / PROJECTION_FILE, ['weight'])['weight']
        backbone, _ = load_hf_model(AutoModel, path, 'the multi-vector backbone')
        return cls(backbone, settings['dim'], settings['skip_ids'], projection).eval()
