"""How closely SSR's scores follow exact MaxSim, per SAE setting and scoring rule, on pseudo-queries.

    PYTHONPATH=. python benchmarks/ssr_fidelity.py --collection irds:vaswani --store runs/ssr/vaswani/store \
        --encoder runs/ssr/encoder

No topics or qrels: ``--queries`` pseudo-queries (a sentence window of a random document, as in self-supervised
training; seed ``--seed``) are scored against every document by exact MaxSim (the store of ``benchmarks/ssr.py``) and,
per SAE (``n_latents:k[:epochs[:vectors]]``: one epoch and ``--max-train-vectors`` of the store's token vectors
unless given, ``all`` for every vector), by ``--scorings`` of

* ``tokens (codes)``: token-level SSR, ``sum_i max_t <z_i, z_t>`` over the codes (:class:`SSRIndex`, exact);
* ``tokens (query decoder, m=M)``: the same index with the query side exact, ``sum_i max_t <w_i, z_t>``,
  ``w_ia = <e_i, D_a>`` for the query token's top ``M`` latents (``query='decoder'``; ``--query-latents``, default
  the setting's k): only the documents are approximated;
* ``tokens (decoder)``: the same MaxSim through the decoder's geometry, ``<z_i W_dec, z_t W_dec>`` (the
  reconstructions without ``b_dec``; dense, no inverted index can compute it as such);
* ``pooled max:sum`` / ``pooled max:max``: the pooled dot product (documents max-pooled per latent, queries summed or
  max-pooled), the single stage of earlier versions.

``--doc-k``: each SAE's documents indexed with these numbers of latents per token (``SSR(doc_k=)``, one index and
set of rows each; the queries keep the SAE's k); ``--models``: score the SAEs of SSR model folders (e.g. the
``ssr-model`` that ``benchmarks/ssr.py`` saves per collection) instead of training ``--settings``, so a choice is made
for the very SAE a retrieval run uses.

Reported per row: overlap@10 of its top 10 with exact MaxSim's, recall of exact MaxSim's top 10 within its top 100,
overlap@100 of its top 100 with exact MaxSim's (what re-ranking its top 100 keeps),
MRR@10 of the document each pseudo-query came from, ms/query of the scoring alone (embeddings given), postings per
document token, and the corpus's fraction of variance explained by its reconstruction with ``doc_k`` latents.  A setting
is chosen from this table, never from test topics.  Prints a table and writes JSON (``--output``). One CPU thread.
"""
import argparse
import json
import random
import time
from pathlib import Path

SCORINGS = ('codes', 'query-decoder', 'decoder', 'pooled')


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--collection', default='irds:vaswani', help='the corpus the store holds')
    parser.add_argument('--store', default='runs/ssr/vaswani/store')
    parser.add_argument('--irds-cache')
    parser.add_argument('--encoder', default='runs/ssr/encoder')
    parser.add_argument('--queries', type=int, default=200)
    parser.add_argument('--seed', type=int, default=123)
    parser.add_argument('--settings', nargs='+', default=['4096:8', '4096:16', '4096:32', '16384:16'],
                        help='n_latents:k[:epochs[:vectors]] of each SAE (vectors: a number or all)')
    parser.add_argument('--scorings', nargs='+', default=list(SCORINGS), choices=SCORINGS)
    parser.add_argument('--query-latents', nargs='+', type=int, help='m of the query-decoder rows (default: k)')
    parser.add_argument('--doc-k', nargs='+', type=int,
                        help="latents per document token (SSR's doc_k), one index per value (default: each SAE's k)")
    parser.add_argument('--models', nargs='+', default=[],
                        help='SSR model folders (e.g. ssr.py\'s work/<collection>/ssr-model): their SAEs are scored '
                             'as they are, instead of training --settings')
    parser.add_argument('--max-train-vectors', type=int, default=100_000)
    parser.add_argument('--work-dir', default='runs/ssr_fidelity')
    parser.add_argument('--output', default='benchmarks/results/ssr_fidelity.json')
    args = parser.parse_args()
    if args.irds_cache:
        from pyterrier_lsr.core.offline import use_irds_cache
        use_irds_cache(args.irds_cache)
    import numpy as np
    import pandas as pd
    import torch

    from pyterrier_lsr.core.collection import load_collection
    from pyterrier_lsr.index.maxsim import MaxSimIndex
    from pyterrier_lsr.index.ssr import SSRIndex
    from pyterrier_lsr.kinds.multivector import MultiVector, maxsim_rows
    from pyterrier_lsr.kinds.ssr import SAE_FOLDER, SSR, train_ssr_sae
    from pyterrier_lsr.models.sae import SparseAutoencoder
    from pyterrier_lsr.train.data import pseudo_query
    torch.set_num_threads(1)
    store = MaxSimIndex(args.store, MultiVector.from_pretrained(args.encoder))
    texts = {d['docno']: d['text'] for d in load_collection(args.collection).corpus}
    rng = random.Random(args.seed)
    sources = rng.sample(range(store.num_docs()), args.queries)
    queries = [pseudo_query(texts[store.docnos[i]], rng) for i in sources]
    q_vectors, q_offsets = store.encoder.embed(queries, query=True)
    q_tensor = torch.from_numpy(q_vectors)
    query_rows = [q_tensor[q_offsets[i]:q_offsets[i + 1]] for i in range(len(queries))]

    def by_query(pair):
        """``(indices, values)`` over all query tokens, cut into one pair per query."""
        return [tuple(a[q_offsets[i]:q_offsets[i + 1]] for a in pair) for i in range(len(queries))]

    def timed_scores(score):
        start = time.perf_counter()
        scores = np.stack([np.asarray(score(i), dtype=np.float64) for i in range(len(queries))])
        return torch.from_numpy(scores), (time.perf_counter() - start) / len(queries) * 1000

    exact, exact_ms = timed_scores(lambda i: store.score_all(query_rows[i]).numpy())
    exact_top10, exact_top100 = exact.topk(10).indices, exact.topk(100).indices
    source = torch.tensor(sources)

    def row(setting, scoring, scores, ms, **extra):
        ranks = (scores > scores[torch.arange(len(scores)), source][:, None]).sum(1)
        top100 = scores.topk(100).indices
        out = {'setting': setting, 'scoring': scoring,
               'mrr@10 source': torch.where(ranks < 10, 1. / (ranks + 1), torch.zeros(())).double().mean().item(),
               'overlap@10 with exact': np.mean([len(set(a[:10].tolist()) & set(b.tolist())) / 10
                                                 for a, b in zip(top100, exact_top10)]),
               'exact top-10 in top-100': np.mean([len(set(a.tolist()) & set(b.tolist())) / 10
                                                   for a, b in zip(top100, exact_top10)]),
               # what re-ranking the top 100 keeps of exact MaxSim's top 100 (the proxy of its R@100)
               'overlap@100 with exact': np.mean([len(set(a.tolist()) & set(b.tolist())) / 100
                                                  for a, b in zip(top100, exact_top100)]),
               'ms/query': ms, **extra}
        print(out, flush=True)
        return out

    rows = [row('exact MaxSim', '', exact, exact_ms)]
    vectors = store.vectors
    variance = (vectors - vectors.mean(0)).pow(2).sum(-1).mean().item()

    def saes():
        """``(folder name, row name, SAE, its info)`` of each SAE: loaded from ``--models``, else trained per
        ``--settings``."""
        for i, folder in enumerate(args.models):
            sae = SparseAutoencoder.from_pretrained(Path(folder) / SAE_FOLDER)
            c = sae.config
            yield (f'model{i}', f'{c.n_latents} latents, k={c.k}, {c.epochs} epoch(s), seed {c.seed} (model {i})',
                   sae, {})
        for setting in [] if args.models else args.settings:
            n_latents, k, epochs, sample = (setting.split(':') + ['1', str(args.max_train_vectors)])[:4]
            n_latents, k, epochs = int(n_latents), int(k), int(epochs)
            start = time.perf_counter()
            sae, log = train_ssr_sae(vectors.numpy(), {'n_latents': n_latents, 'k': k, 'epochs': epochs},
                                     None if sample == 'all' else int(sample), verbose=False)
            yield (setting.replace(':', '-'), f'{n_latents} latents, k={k}, {epochs} epoch(s), {sample} vectors',
                   sae, {'fve': log[-1]['fve'], 'sae s': time.perf_counter() - start})

    for folder, sae_name, sae, sae_info in saes():
        k = sae.config.k
        for doc_k in args.doc_k or [k]:
            ssr = SSR(store.encoder, sae, query_pooling='sum', doc_k=doc_k)
            index = SSRIndex.write(Path(args.work_dir) / f'{folder}-doc{doc_k}', store.docnos, vectors.numpy(),
                                   store.offsets, ssr, overwrite=True, save_model=False)
            q_codes = by_query(ssr.token_codes(q_vectors))
            name = sae_name if doc_k == k else f'{sae_name}, doc_k={doc_k}'
            with torch.inference_mode():  # the corpus's reconstruction with doc_k latents (the training fve: k)
                recon = torch.cat([sae._decode_sparse(*sae.encode_topk(vectors[s:s + 65536], doc_k))
                                   for s in range(0, len(vectors), 65536)])
                error = (vectors - recon - sae.b_dec).pow(2).sum(-1).mean().item()
            info = {**sae_info, 'doc_k': doc_k, 'corpus fve at doc_k': 1 - error / variance,
                    'postings/token': len(index.tokens) / len(vectors)}
            if 'codes' in args.scorings:
                rows.append(row(name, 'tokens (codes)', *timed_scores(lambda i: index.score_tokens(*q_codes[i])),
                                **info))
            for m in (args.query_latents or [k]) if 'query-decoder' in args.scorings else []:
                w_rows = by_query(ssr.query_codes(q_vectors, 'decoder', m))
                rows.append(row(name, f'tokens (query decoder, m={m})',
                                *timed_scores(lambda i: index.score_tokens(*w_rows[i])), **info))
            if 'decoder' in args.scorings:
                with torch.inference_mode():
                    q_recon = sae._decode_sparse(*sae.encode_topk(q_tensor))
                rows.append(row(name, 'tokens (decoder)', *timed_scores(
                    lambda i: maxsim_rows(q_recon[q_offsets[i]:q_offsets[i + 1]], recon, store.lengths).numpy()),
                    **info))
            for pooling in ('sum', 'max') if 'pooled' in args.scorings else ():
                ssr.query_pooling = pooling
                rows.append(row(name, f'pooled max:{pooling}',
                                *timed_scores(lambda i: index.score_pooled(*q_codes[i])), **info))
    table = pd.DataFrame(rows)
    print(table.round(3).to_string(index=False))
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps({'args': vars(args), 'rows': rows}, indent=1))


if __name__ == '__main__':
    main()
