"""How closely SSR's single-stage scores follow exact MaxSim, per SAE setting and pooling rule, on pseudo-queries.

    python benchmarks/ssr_fidelity.py --collection irds:vaswani --store runs/ssr/vaswani/store \
        --encoder runs/ssr/encoder

No topics or qrels: ``--queries`` pseudo-queries (a sentence window of a random document, as in self-supervised
training; seed ``--seed``) are scored against every document by exact MaxSim (the store of ``benchmarks/ssr.py``)
and by SSR's sparse dot product (computed densely in torch, without PISA's quantization).  Reported per setting:
overlap@10 of the two top-10s, recall of exact MaxSim's top-10 within SSR's top-100, and MRR@10 of the document
each pseudo-query came from (for exact MaxSim too).  A setting is chosen from this table, never from test topics.

Prints a table and writes JSON (``--output``). One CPU thread.
"""
import argparse
import json
import random
import time
from pathlib import Path


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--collection', default='irds:vaswani', help='the corpus the store holds')
    parser.add_argument('--store', default='runs/ssr/vaswani/store')
    parser.add_argument('--irds-cache')
    parser.add_argument('--encoder', default='runs/ssr/encoder')
    parser.add_argument('--queries', type=int, default=300)
    parser.add_argument('--seed', type=int, default=123)
    parser.add_argument('--settings', nargs='+', default=['4096:4', '4096:8', '4096:16', '4096:32', '16384:8'],
                        help='n_latents:k of each SAE')
    parser.add_argument('--poolings', nargs='+', default=['max:sum', 'max:max'], help='doc:query pooling')
    parser.add_argument('--max-train-vectors', type=int, default=200_000)
    parser.add_argument('--output', default='benchmarks/results/ssr_fidelity.json')
    args = parser.parse_args()
    if args.irds_cache:
        from pyterrier_lsr.offline import use_irds_cache
        use_irds_cache(args.irds_cache)
    import numpy as np
    import pandas as pd
    import torch

    from pyterrier_lsr.collections import load_collection
    from pyterrier_lsr.multivector import MaxSimIndex, MultiVector
    from pyterrier_lsr.ssr import pool_codes, train_ssr_sae
    from pyterrier_lsr.train.data import pseudo_query
    torch.set_num_threads(1)
    store = MaxSimIndex(args.store, MultiVector.from_pretrained(args.encoder))
    texts = {d['docno']: d['text'] for d in load_collection(args.collection).corpus}
    rng = random.Random(args.seed)
    sources = rng.sample(range(store.num_docs()), args.queries)
    queries = [pseudo_query(texts[store.docnos[i]], rng) for i in sources]
    q_vectors, q_offsets = store.encoder.embed(queries, query=True)
    q_vectors = torch.from_numpy(q_vectors)
    exact = torch.stack([store.score_all(q_vectors[q_offsets[i]:q_offsets[i + 1]]) for i in range(len(queries))])
    vectors = store.vectors
    owner = torch.repeat_interleave(torch.arange(store.num_docs()), store.lengths)
    q_owner = torch.repeat_interleave(torch.arange(len(queries)), torch.from_numpy(np.diff(q_offsets)))
    source = torch.tensor(sources)

    def mrr(scores):
        ranks = (scores > scores[torch.arange(len(scores)), source][:, None]).sum(1)
        return torch.where(ranks < 10, 1. / (ranks + 1), torch.zeros(())).mean().item()

    exact_top10 = exact.topk(10).indices
    rows = [{'setting': 'exact MaxSim', 'pooling': '', 'mrr@10 source': mrr(exact)}]
    for setting in args.settings:
        n_latents, k = map(int, setting.split(':'))
        start = time.perf_counter()
        sae, log = train_ssr_sae(vectors.numpy(), {'n_latents': n_latents, 'k': k}, args.max_train_vectors,
                                 verbose=False)
        sae_s = time.perf_counter() - start
        with torch.inference_mode():
            d_codes = [sae.encode_topk(vectors[s:s + 65536]) for s in range(0, len(vectors), 65536)]
            d_idx, d_val = torch.cat([c[0] for c in d_codes]), torch.cat([c[1] for c in d_codes])
            q_idx, q_val = sae.encode_topk(q_vectors)
            for pooling in args.poolings:
                doc_pool, query_pool = pooling.split(':')
                docs = pool_codes(d_idx, d_val, owner, store.num_docs(), n_latents, doc_pool)
                qs = pool_codes(q_idx, q_val, q_owner, len(queries), n_latents, query_pool)
                scores = qs @ docs.T
                top100 = scores.topk(100).indices
                overlap = np.mean([len(set(a[:10].tolist()) & set(b.tolist())) / 10
                                   for a, b in zip(top100, exact_top10)])
                recall = np.mean([len(set(a.tolist()) & set(b.tolist())) / 10 for a, b in zip(top100, exact_top10)])
                rows.append({'setting': f'{n_latents} latents, k={k}', 'pooling': pooling, 'mrr@10 source': mrr(scores),
                             'overlap@10 with exact': overlap, 'exact top-10 in top-100': recall,
                             'postings/doc': (docs > 0).sum(1).float().mean().item(), 'fve': log[-1]['fve'],
                             'sae s': sae_s})
                print(rows[-1], flush=True)
    table = pd.DataFrame(rows)
    print(table.round(3).to_string(index=False))
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps({'args': vars(args), 'rows': rows}, indent=1))


if __name__ == '__main__':
    main()
