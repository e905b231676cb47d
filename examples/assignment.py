"""BM25, SPLADE, IDF queries, Latent Terms and VT-SPLADE on plain files; a re-run only evaluates (docs/assignment.md)"""
import argparse
from pathlib import Path

import pyterrier as pt
from pyterrier.measures import AP, R, nDCG

from pyterrier_lsr import IDFQueryEncoder, Splade, load_collection
from pyterrier_lsr.core.quiet import quiet_native
from pyterrier_lsr.report import figure
from pyterrier_lsr.systems import bm25, latent_terms_index, sparse_index, vt_splade
from pyterrier_lsr.train import DomainConfig

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument('collection', help='a folder holding docs.jsonl, topics.tsv and qrels.txt')
parser.add_argument('--workdir', default='assignment', help='models and indexes, reused by a second run')
parser.add_argument('--steps', type=int, default=120, help="VT-SPLADE's training steps (default: the recipe's 120)")
parser.add_argument('--latents', type=int, default=16384, help="Latent Terms' SAE width")
parser.add_argument('--verbose', action='store_true', help='progress bars, training logs and native output')
a = parser.parse_args()
c, w, v = load_collection(a.collection), Path(a.workdir), a.verbose
with quiet_native(v):  # PISA's and transformers' chatter, shown only if something fails
    splade = sparse_index(w / 'splade.lsr', Splade.from_pretrained('splade-tiny'), c.corpus, verbose=v)
    vt = vt_splade(c.corpus, w / 'vt-splade', DomainConfig.two_sided(steps=a.steps), cache_dir=w / 'cache', verbose=v)
    s = {'BM25': bm25(w / 'bm25.pisa', c.corpus, verbose=v), 'SPLADE': splade.retriever(),
         'SPLADE + IDF queries': splade.retriever(query_encoder=IDFQueryEncoder.from_index(splade)),
         'Latent Terms': latent_terms_index(w / 'latent-terms.lsr', c.corpus, cache_dir=w / 'cache', verbose=v,
                                            sae={'n_latents': a.latents, 'k': 16}).retriever(),
         'VT-SPLADE': sparse_index(w / 'vt-splade.lsr', vt, c.corpus, verbose=v).retriever()}
    table = pt.Experiment(list(s.values()), c.topics, c.qrels, [nDCG @ 10, AP, R @ 100, 'mrt'], names=list(s))
print(table.to_string(index=False, float_format='%.3f'))
figure(table, 'nDCG@10', 'mrt').savefig(w / 'plot.png', dpi=120, bbox_inches='tight')
