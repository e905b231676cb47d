"""SAE-SPLADE: a sparse autoencoder's latents in place of the wordpiece vocabulary (METHODS.md §4).

Stage 1 (:func:`train_token_sae`) trains a TopK SAE on the frozen backbone's L2-normalised token states, with the
SAE trainer and the cached token-state extraction Latent Terms uses.  Stage 2 (:class:`SaeSpladeModel`) drops the
decoder and fine-tunes backbone + SAE encoder with the bundled loop; a text's vector over latents ``j`` is

    ``v_j = α · log(1 + max_i z_ij)``,  ``z_i = relu(topk((x_i - b_dec) W_enc + b_enc))``,  ``x_i = h_i / |h_i|``

so the loop's (and PISA's) dot product is ``α² <log(1 + max z_q), log(1 + max z_d)>`` with a learned scalar ``α``.

Choices (all fixed by the saved settings):

* **Special tokens** (``[CLS]``, ``[SEP]``, ``[PAD]``, ...; not ``[UNK]``, which stands for real text) take no part in
  the max: their states are alike in every text, so their latents would be posted in every document.  (Stage 1
  trains on all token states, special ones included; they are 2 of ~48 per Vaswani document.)
* **TopK stays on** at inference and in training: each token activates at most ``k`` latents, so vectors are sparse
  by construction (at most ``k x tokens`` non-zeros) before FLOPS regularization does anything.
* **α** starts at :data:`DEFAULT_ALPHA`, chosen so that the initial scores are on SPLADE's scale (see there).
* The SAE's decoder is kept, frozen and unused: the saved ``sae/`` folder stays a complete SAE that
  :meth:`SparseAutoencoder.from_pretrained` reads (e.g. to compare latents before and after fine-tuning).

A model folder is the backbone's HF folder (our settings in ``config.json`` under ``lsr``, ``kind: sae-splade``) + the
tokenizer + ``sae/``; :meth:`SaeSplade.from_pretrained` rebuilds it exactly and
:func:`pyterrier_lsr.load_model` (hence ``LsrIndex(path).retriever()``) recognises it.
"""
import json
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn

from ..encoders import Splade
from ..encoding import is_blank
from ..latent_terms import DenseFeatures, LatentTerms, load_dense, train_latent_sae
from .sae import SparseAutoencoder, latent_term_names
from .splade import CONFIG_KEY

KIND = 'sae-splade'
SAE_FOLDER = 'sae'
# Stage-1 latents of unit-norm token states are at most ~1, so log(1 + max z) lies in [0, 0.7] and with α = 1 scores
# are ~20x below SPLADE's.  Measured on 200 Vaswani training pairs (SPLADE-tiny backbone, 16,384 latents, k = 8):
# mean query-positive score 0.65 at α = 1 vs SPLADE-tiny's 14.7 (score spreads: 0.29 vs 6.4), i.e. α² ≈ 22.
DEFAULT_ALPHA = 4.7


def structural_token_ids(tokenizer) -> List[int]:
    """Special token ids whose positions take no part in pooling: all but ``[UNK]`` (which stands for real text)."""
    return sorted(set(tokenizer.all_special_ids) - {tokenizer.unk_token_id})


class SaeSpladeModel(nn.Module):
    """Backbone (HF ``AutoModel``) + SAE encoder + ``α``: ``(input_ids, attention_mask)`` -> ``batch x n_latents``.

    Args:
        backbone: an HF encoder returning ``last_hidden_state`` (e.g. ``BertForMaskedLM.bert``); fine-tuned.
        sae: a per-token TopK :class:`SparseAutoencoder` over this backbone's token states (``d_in`` = hidden size).
        skip_ids: token ids whose positions are not pooled (see :func:`structural_token_ids`).
        alpha: initial value of the learned scale.
    """

    def __init__(self, backbone: nn.Module, sae: SparseAutoencoder, skip_ids: Sequence[int] = (),
                 alpha: float = DEFAULT_ALPHA):
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
        self.alpha = nn.Parameter(torch.tensor(float(alpha)))
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
                'topk': 'per-token', 'sae': SAE_FOLDER}

    def token_latents(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        """Each pooled token's top-k latents: ``(indices, values, owner)``, ``n x k``, ``n x k`` and ``n`` (its text),
        tokens in row-major (text, position) order over the non-skipped, non-padding positions."""
        vectors, owner = self.features(input_ids, attention_mask)
        indices, values = self.sae.encode_topk(vectors)
        return indices, values, owner

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        indices, values, owner = self.token_latents(input_ids, attention_mask)
        n_latents = self.sae.n_latents
        # max_i z_ij per text without the dense tokens x latents tensor; z >= 0, so the zero start changes no maximum.
        flat = (owner[:, None] * n_latents + indices).flatten()
        pooled = values.new_zeros(len(input_ids) * n_latents).scatter_reduce(0, flat, values.flatten(), 'amax')
        return self.alpha * torch.log1p(pooled.view(len(input_ids), n_latents))

    def save_pretrained(self, path, **kwargs):
        """The backbone's HF folder with our settings in ``config.json`` (``lsr``), and the SAE under ``sae/``."""
        path = Path(path)
        setattr(self.backbone.config, CONFIG_KEY, self.settings)
        self.backbone.save_pretrained(str(path), **kwargs)
        self.sae.save_pretrained(path / SAE_FOLDER)

    @classmethod
    def from_pretrained(cls, path, skip_ids: Sequence[int] = ()) -> 'SaeSpladeModel':
        from transformers import AutoModel
        if not is_sae_splade_folder(path):
            raise ValueError(f'{path} is not an SAE-SPLADE folder (config.json has no {CONFIG_KEY}.kind = {KIND!r})')
        backbone = AutoModel.from_pretrained(str(path))
        settings = getattr(backbone.config, CONFIG_KEY)
        sae = SparseAutoencoder.from_pretrained(Path(path) / settings['sae'])
        return cls(backbone, sae, skip_ids, alpha=settings['alpha'])


def is_sae_splade_folder(path) -> bool:
    config = Path(path) / 'config.json'
    return config.is_file() and (json.loads(config.read_text()).get(CONFIG_KEY) or {}).get('kind') == KIND


class SaeSplade(Splade):
    """:class:`~pyterrier_lsr.Splade` over an :class:`SaeSpladeModel`: the same encoders, scorer, indexer and training
    loop, with latent ids (``l<id>``) as terms, plus interpretability helpers."""

    @classmethod
    def from_pretrained(cls, path: str, **kwargs) -> 'SaeSplade':
        """Loads a folder written by :meth:`save_pretrained`; ``kwargs`` go to :class:`~pyterrier_lsr.Splade`."""
        from transformers import AutoTokenizer
        tokenizer = AutoTokenizer.from_pretrained(str(path))
        model = SaeSpladeModel.from_pretrained(path, structural_token_ids(tokenizer))
        return cls(model, tokenizer, name=str(path), **kwargs)

    @classmethod
    def from_backbone(cls, backbone: str, sae: SparseAutoencoder, alpha: float = DEFAULT_ALPHA, **kwargs) -> 'SaeSplade':
        """A stage-2 model (before fine-tuning) from a backbone name/folder (offline names resolve, e.g.
        ``'splade-tiny'``; an MLM checkpoint's head is dropped) and a stage-1 SAE trained on its token states."""
        model, tokenizer = load_dense(backbone)
        return cls(SaeSpladeModel(model, sae, structural_token_ids(tokenizer), alpha), tokenizer, **kwargs)

    def save_pretrained(self, path: str):
        """Writes one folder (backbone, tokenizer, SAE, settings).  The model is then named by ``path``, so an index
        built afterwards records it and ``LsrIndex(index_path).retriever()`` can reload it."""
        super().save_pretrained(path)
        self.name = str(path)

    def top_words(self, texts: Sequence, latents: Optional[Sequence[int]] = None, n: int = 10,
                  batch_size: Optional[int] = None) -> Dict[int, List[Tuple[str, float]]]:
        """See :func:`latent_top_words`."""
        return latent_top_words(self, texts, latents, n, batch_size)

    def explain(self, text: str, top: int = 10, words: Optional[Dict[int, List[Tuple[str, float]]]] = None) -> List[dict]:
        """See :func:`explain`."""
        return explain(self, text, top, words)


def _word_spans(encoding, text: str, n_tokens: int) -> List[Optional[str]]:
    """The (lowercased) word each token position belongs to, wordpieces merged (``None`` for special tokens)."""
    word_ids = encoding.word_ids[:n_tokens]
    spans: Dict[int, List[int]] = {}
    for (start, end), word in zip(encoding.offsets[:n_tokens], word_ids):
        if word is not None:
            span = spans.setdefault(word, [start, end])
            span[0], span[1] = min(span[0], start), max(span[1], end)
    return [None if w is None else text[spans[w][0]:spans[w][1]].lower() for w in word_ids]


@torch.inference_mode()
def latent_top_words(splade: SaeSplade, texts: Sequence, latents: Optional[Sequence[int]] = None, n: int = 10,
                     batch_size: Optional[int] = None) -> Dict[int, List[Tuple[str, float]]]:
    """For each latent (all, or ``latents``), the ``n`` words of ``texts`` that activate it most: ``{latent: [(word,
    activation), ...]}``, best first, a word's activation being its largest SAE activation ``z`` over its wordpieces
    and occurrences.  Words are whole words (wordpieces merged through the fast tokenizer's offsets), lowercased.
    Latents that never fire on ``texts`` are absent.
    """
    tokenizer, model = splade.tokenizer, splade.model
    if not tokenizer.is_fast:
        raise ValueError('latent_top_words needs a fast tokenizer (word offsets)')
    if n < 1:
        raise ValueError(f'n must be >= 1, got {n}')
    texts = [str(t) for t in texts if not is_blank(t)]
    wanted = None if latents is None else torch.tensor(sorted(set(latents)), dtype=torch.long)
    vocabulary: Dict[str, int] = {}
    keys, values = torch.empty(0, dtype=torch.long), torch.empty(0)  # (latent, word) pairs and their best activation
    batch_size = batch_size or splade.batch_size
    was_training = model.training
    model.eval()
    for start in range(0, len(texts), batch_size):
        batch = texts[start:start + batch_size]
        enc = tokenizer(batch, truncation=True, max_length=splade.max_length, padding=True, return_tensors='pt')
        ids, mask = enc['input_ids'].to(splade.device), enc['attention_mask'].to(splade.device)
        indices, acts, _ = model.token_latents(ids, mask)
        # The pooled positions, in the row-major order of the token latents.
        text_of, position = model.features.token_mask(ids, mask).nonzero(as_tuple=True)
        spans = [_word_spans(enc.encodings[i], batch[i], int(mask[i].sum())) for i in range(len(batch))]
        word = torch.tensor([vocabulary.setdefault(spans[t][p] or '', len(vocabulary))
                             for t, p in zip(text_of.tolist(), position.tolist())], dtype=torch.long)
        indices, acts = indices.cpu(), acts.float().cpu()
        batch_keys = (indices * (1 << 32) + word[:, None]).flatten()
        keep = acts.flatten() > 0
        if wanted is not None:
            keep &= torch.isin(indices.flatten(), wanted)
        keys = torch.cat([keys, batch_keys[keep]])
        values = torch.cat([values, acts.flatten()[keep]])
        keys, inverse = keys.unique(return_inverse=True)
        values = torch.zeros(len(keys)).scatter_reduce(0, inverse, values, 'amax')
    if was_training:
        model.train()
    words = np.array(list(vocabulary), dtype=object)
    latent_of, word_of = (keys >> 32).numpy(), (keys & ((1 << 32) - 1)).numpy()
    order = np.lexsort((-values.numpy(), latent_of))
    out: Dict[int, List[Tuple[str, float]]] = {}
    for i in order:
        found = out.setdefault(int(latent_of[i]), [])
        if len(found) < n:
            found.append((str(words[word_of[i]]), float(values[i])))
    return out


def explain(splade: SaeSplade, text: str, top: int = 10,
            words: Optional[Dict[int, List[Tuple[str, float]]]] = None) -> List[dict]:
    """The ``top`` latents of ``text`` by weight, each as ``{'term', 'latent', 'weight', 'in_text', 'words'}``:
    ``in_text`` = the words of this text that activate it (best first, with their activations), ``words`` = its top
    words on a corpus when ``words`` (a :func:`latent_top_words` result) is given, else ``[]``."""
    vector = splade.encode([text])[0]
    best = sorted(vector.items(), key=lambda item: -item[1])[:top]
    latents = [int(term[1:]) for term, _ in best]
    local = latent_top_words(splade, [text], latents, n=5) if latents else {}
    return [{'term': term, 'latent': latent, 'weight': weight, 'in_text': local.get(latent, []),
             'words': (words or {}).get(latent, [])} for (term, weight), latent in zip(best, latents)]


def train_token_sae(backbone: str, texts: Sequence, sae: Optional[dict] = None, cache_dir='sae_splade_cache',
                    max_train_vectors: Optional[int] = 200_000, verbose: bool = True, **latent_terms_kwargs):
    """Stage 1: a TopK SAE on ``backbone``'s frozen, L2-normalised token states of ``texts`` (cached in
    ``cache_dir``; a seeded sample of at most ``max_train_vectors`` trains it).  ``sae``: :class:`SAEConfig` settings
    (``n_latents``, ``k``, ``k_aux``, ``aux_coef``, ``epochs``...; ``d_in`` comes from the backbone);
    ``latent_terms_kwargs``: device, batch_size, max_length, precision of the extraction.  Returns ``(sae, log)``."""
    features = LatentTerms(backbone, mode='multi', **latent_terms_kwargs)
    model, log, _, _ = train_latent_sae(features, texts, sae, cache_dir, max_train_vectors, verbose)
    return model, log
