"""SSR against exact MaxSim and a k-means (PLAID-style) clustering baseline, same multi-vector encoder for all rows.

    python benchmarks/ssr.py --irds-cache PATH

1. Encoder: all-MiniLM-L6-v2 + a 128-d projection trained with MaxSim InfoNCE (``--steps``; the projection alone
   unless ``--train-backbone``, a shared 2-core CPU's budget) on self-supervised pairs from every collection's corpus
   (no topics or qrels); saved to / reused from ``--encoder``.
2. Per collection: the corpus's token embeddings (one transformer pass, timed, shared by every row) go to a MaxSim
   store; then
   * exact MaxSim: brute force over the store;
   * SSR token-level: a TopK SAE on (a sample of) the token embeddings; every token's code indexed with its token
     identity (``pyterrier_lsr/ssr_index.py``), queries scored by ``sum_i max_t <z_i, z_t>`` exactly; indexing =
     SAE training + codes + postings;
   * with ``--query decoder``, also SSR token-level with the query side exact: each query token's embedding against
     the SAE's decoder rows, its top ``--query-latents`` latents (default k), ``sum_i max_t <w_i, z_t>``
     (``SSRIndex.retriever(query='decoder')``), and its re-ranked top ``--rerank-depth``; the ratios then compare
     these rows with exact MaxSim;
   * SSR pooled (PISA): the same SAE's codes max-pooled per document into a PISA index, queries pooled by
     ``--query-pooling`` (see ``pyterrier_lsr/ssr.py``); indexing = SAE training + codes + PISA;
   * SSR + MaxSim: the token-level (and the pooled, float, same index) top ``--rerank-depth`` re-scored exactly
     from the store;
   * clustering: ColBERTv2/PLAID-style k-means (faiss, ``2^floor(log2(16 sqrt(tokens)))`` centroids, 4 iterations)
     + assignment; search probes ``--ncells`` cells per query token, keeps ``--ndocs`` by centroid interaction, then
     exact MaxSim; indexing = k-means + assignment + inverted lists;
   * BM25 (PISA) as a reference.
   A store from an earlier run with the same encoder and corpus is reused (no second transformer pass); with
   ``--reuse-sae``, so is the SAE that run trained and saved (``ssr-model/`` and ``sae.json``: its seconds and final
   log) for the same SAE arguments, so a run that changes only the index (``--doc-k``) or the query side does not
   retrain it.  ``--doc-k``: latents per document token in the token-level index (``SSR(doc_k=)``; the pooled PISA
   rows keep the SAE's k).
   Postings accumulated per query by the token-level first stage (per query side), nDCG@10, R@100 and mean
   response time (pt.Experiment's ``mrt``, after one warm-up pass; every row encodes its queries with the
   transformer) and index sizes on disk.

Prints a table and writes JSON (``--output``). One CPU thread (``--threads``).  Run with ``PYTHONPATH=.``.
"""
import argparse
import json
import time
from pathlib import Path


def folder_bytes(path: Path, pattern: str = '*') -> int:
    return sum(p.stat().st_size for p in Path(path).rglob(pattern) if p.is_file())


def reusable(store_path: Path, encoder_dir: Path, docs) -> bool:
    """A store written earlier by this script for the same encoder and corpus (the embedding pass is deterministic;
    the store keeps float16, so later rows then all read float16-rounded embeddings)."""
    from pyterrier_lsr.index.maxsim import STORE_FILE
    if not (store_path / STORE_FILE).exists():
        return False
    meta = json.loads((store_path / STORE_FILE).read_text())
    docnos = json.loads((store_path / 'docnos.json').read_text())
    return meta['model'] == str(encoder_dir) and docnos == [d['docno'] for d in docs]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--irds-cache')
    parser.add_argument('--collections', nargs='+', default=['irds:vaswani'],
                        help='irds: ids or folders of docs.jsonl, topics.tsv and qrels.txt (e.g. path/to/cisi)')
    parser.add_argument('--encoder', default='runs/ssr/encoder', help='trained encoder folder (trained if missing)')
    parser.add_argument('--work-dir', default='runs/ssr')
    parser.add_argument('--steps', type=int, default=150)
    parser.add_argument('--batch-size', type=int, default=16)
    parser.add_argument('--lr', type=float, default=1e-3)
    parser.add_argument('--train-backbone', action='store_true', help='fine-tune the backbone too (CPU-heavy)')
    parser.add_argument('--projection-lr-factor', type=float, default=1., help='lr factor of the projection')
    parser.add_argument('--max-length', type=int, default=256)
    parser.add_argument('--train-max-length', type=int, default=128)
    parser.add_argument('--latents', type=int, default=4096)
    parser.add_argument('--k', type=int, default=16)
    parser.add_argument('--sae-epochs', type=int, default=1)
    parser.add_argument('--sae-seed', type=int, default=0, help="the SAE's initialisation and sample seed")
    parser.add_argument('--doc-k', type=int, help="latents per document token in the token-level index (default: k)")
    parser.add_argument('--reuse-sae', action='store_true',
                        help='reuse the SAE an earlier run saved in --work-dir for the same store and SAE arguments')
    parser.add_argument('--doc-pooling', default='max')
    parser.add_argument('--query-pooling', default='sum')
    parser.add_argument('--max-train-vectors', type=int, default=200_000, help='SAE training sample; 0: all')
    parser.add_argument('--query', choices=['codes', 'decoder'], default='codes',
                        help="the token-level query side of the ratios (decoder: adds the query='decoder' rows)")
    parser.add_argument('--query-latents', type=int, nargs='+',
                        help="m of query='decoder', one pair of rows each; the ratios use the first (default: k)")
    parser.add_argument('--rerank-depth', type=int, default=100)
    parser.add_argument('--ncells', type=int, default=2)
    parser.add_argument('--ndocs', type=int, default=1024)
    parser.add_argument('--threads', type=int, default=1)
    parser.add_argument('--output', default='benchmarks/results/ssr.json')
    args = parser.parse_args()
    if args.irds_cache:
        from pyterrier_lsr.core.offline import use_irds_cache
        use_irds_cache(args.irds_cache)
    import faiss
    import numpy as np
    import pandas as pd
    import pyterrier as pt
    import pyterrier_pisa
    import torch
    from pyterrier.measures import R, nDCG

    from pyterrier_lsr import SpladeIndexer
    from pyterrier_lsr.core.collection import load_collection
    from pyterrier_lsr.index.maxsim import MaxSimIndex
    from pyterrier_lsr.index.ssr import SSRIndex
    from pyterrier_lsr.kinds.multivector import MultiVector
    from pyterrier_lsr.kinds.ssr import SAE_FOLDER, SSR, train_ssr_sae
    from pyterrier_lsr.models.sae import SparseAutoencoder
    from pyterrier_lsr.train import TrainConfig, self_supervised
    from pyterrier_lsr.train.multivector import train_multivector
    torch.set_num_threads(args.threads)
    faiss.omp_set_num_threads(args.threads)
    work = Path(args.work_dir)
    collections = [load_collection(spec) for spec in args.collections]

    encoder_dir = Path(args.encoder)
    train_seconds = None
    if not (encoder_dir / 'multivector.json').exists():
        encoder = MultiVector.from_backbone('all-MiniLM-L6-v2', max_length=args.max_length)
        examples = [ex for c in collections for ex in self_supervised(c.corpus, num_negatives=1, verbose=False)]
        config = TrainConfig(steps=args.steps, batch_size=args.batch_size, lr=args.lr, warmup_steps=args.steps // 10,
                             lr_multipliers={'projection': args.projection_lr_factor} if args.train_backbone else {},
                             query_max_length=32,
                             max_length=args.train_max_length, log_every=10)
        start = time.perf_counter()
        train_multivector(encoder.model, encoder.tokenizer, examples, work / 'train', config,
                          train_backbone=args.train_backbone)
        train_seconds = time.perf_counter() - start
        encoder.save_pretrained(encoder_dir)
    encoder = MultiVector.from_pretrained(encoder_dir, max_length=args.max_length)

    rows, report = [], {'args': vars(args), 'encoder_train_seconds': train_seconds, 'collections': {}}
    for collection in collections:
        name = collection.name
        docs = collection.corpus
        store_path, embed_file = work / name / 'store', work / name / 'embed.json'
        store_reused = reusable(store_path, encoder_dir, docs)
        if store_reused:
            store = MaxSimIndex(store_path, encoder)
            vectors, offsets = store.vectors().numpy(), store.offsets
            embed_s = json.loads(embed_file.read_text())['embed_s'] if embed_file.exists() else None
        else:
            start = time.perf_counter()
            vectors, offsets = encoder.embed([d['text'] for d in docs], verbose=True)
            embed_s = time.perf_counter() - start
            store = MaxSimIndex.write(store_path, [d['docno'] for d in docs], vectors, offsets, encoder, overwrite=True)
            embed_file.write_text(json.dumps({'embed_s': embed_s}))
        info = {'docs': len(docs), 'tokens': int(offsets[-1]), 'embed_s': embed_s}

        sae_run = {'encoder': str(encoder_dir), 'latents': args.latents, 'k': args.k, 'sae_epochs': args.sae_epochs,
                   'sae_seed': args.sae_seed, 'max_train_vectors': args.max_train_vectors}
        model_dir, sae_file = work / name / 'ssr-model', work / name / 'sae.json'
        earlier = json.loads(sae_file.read_text()) if args.reuse_sae and sae_file.exists() else {}
        info['sae_reused'] = store_reused and earlier.get('run') == sae_run and (model_dir / SAE_FOLDER).is_dir()
        if info['sae_reused']:
            sae = SparseAutoencoder.from_pretrained(model_dir / SAE_FOLDER)
            sae_s, sae_log = earlier['sae_s'], earlier['log']
        else:
            start = time.perf_counter()
            sae, sae_log = train_ssr_sae(vectors, {'n_latents': args.latents, 'k': args.k, 'epochs': args.sae_epochs,
                                                   'seed': args.sae_seed},
                                         args.max_train_vectors or None, verbose=False)
            sae_s = time.perf_counter() - start
        ssr = SSR(encoder, sae, args.doc_pooling, args.query_pooling, doc_k=args.doc_k)
        start = time.perf_counter()
        tokens = SSRIndex.write(work / name / 'ssr.tokens', [d['docno'] for d in docs], vectors, offsets, ssr,
                                overwrite=True, save_model=False)
        tokens_s = time.perf_counter() - start
        start = time.perf_counter()
        toks = ssr.encode_vectors(vectors, offsets)
        codes_s = time.perf_counter() - start
        start = time.perf_counter()
        index = SpladeIndexer(work / name / 'ssr.lsr', ssr, overwrite=True, verbose=False).index(
            {'docno': d['docno'], 'toks': t} for d, t in zip(docs, toks))
        pisa_s = time.perf_counter() - start
        ssr.save_pretrained(model_dir)
        sae_file.write_text(json.dumps({'run': sae_run, 'sae_s': sae_s, 'log': sae_log[-1:]}, default=float))
        info['ssr'] = {'sae_s': sae_s, 'token_index_s': tokens_s, 'codes_s': codes_s, 'pisa_s': pisa_s,
                       'sae_final': sae_log[-1], 'pooled_postings_per_doc': sum(map(len, toks)) / len(toks),
                       'token_postings_per_token': len(tokens.tokens) / len(vectors)}

        ivf = store.build_ivf()
        start = time.perf_counter()
        clustering = store.ivf_retriever(args.ncells, args.ndocs)
        lists_s = time.perf_counter() - start
        info['clustering'] = {**ivf, 'lists_s': lists_s}

        bm25 = pyterrier_pisa.PisaIndex(str(work / name / 'bm25.pisa'), text_field='text', overwrite=True)
        bm25.index(docs)
        depth = args.rerank_depth
        names = {'bm25': 'BM25 (reference)', 'exact': 'exact MaxSim', 'tokens': 'SSR token-level',
                 'pooled': 'SSR pooled (PISA)', 'tokens+': f'SSR token-level + MaxSim top-{depth}',
                 'pooled+': f'SSR pooled + MaxSim top-{depth}', 'kmeans': 'clustering (k-means, PLAID-style)'}
        systems = {
            names['bm25']: bm25.bm25(num_results=1000, threads=args.threads),
            names['exact']: store.retriever(1000),
            names['tokens']: tokens.retriever(1000, query='codes'),
            names['pooled']: index.retriever(1000, threads=args.threads),
            names['tokens+']: ssr.reranked(tokens, store, depth, query='codes'),
            names['pooled+']: ssr.reranked(tokens, store, depth, mode='pooled'),
            names['kmeans']: clustering,
        }
        decoder_names = []
        for m in (args.query_latents or [args.k]) if args.query == 'decoder' else []:
            pair = (f'SSR token-level, query decoder (m={m})',
                    f'SSR token-level, query decoder (m={m}) + MaxSim top-{depth}')
            decoder_names.extend(pair)
            systems[pair[0]] = tokens.retriever(1000, query='decoder', query_latents=m)
            systems[pair[1]] = ssr.reranked(tokens, store, depth, query='decoder', query_latents=m)
        if decoder_names:
            names.update({'decoder': decoder_names[0], 'decoder+': decoder_names[1]})
        topics = collection.topics
        # the work of the token-level first stage: postings accumulated per query (positive weights only, as scored)
        lengths = np.diff(tokens.indptr)
        q_vectors, q_offsets = encoder.embed(topics['query'].tolist(), query=True)
        sides = [('codes', None)] + [('decoder', m) for m in (args.query_latents or [args.k])
                                     if args.query == 'decoder']
        info['ssr']['postings_per_query'] = {}
        for side, m in sides:
            indices, values = ssr.query_codes(q_vectors, side, m)
            read = np.add.reduceat((lengths[indices] * (values > 0)).sum(1), q_offsets[:-1])
            info['ssr']['postings_per_query'][side if m is None else f'{side} m={m}'] = float(read.mean())
        for system in systems.values():
            system(topics.head(5))  # warm-up: index loading, first-call costs
        res = pt.Experiment(list(systems.values()), topics, collection.qrels, [nDCG @ 10, R @ 100, 'mrt'],
                            names=list(systems))
        token_index_s = sae_s + tokens_s
        pooled_index_s = sae_s + codes_s + pisa_s
        index_seconds = {names['exact']: 0., names['tokens']: token_index_s, names['tokens+']: token_index_s,
                         names['pooled']: pooled_index_s, names['pooled+']: token_index_s,
                         names['kmeans']: ivf['kmeans_s'] + ivf['assign_s'] + lists_s}
        store_mb = folder_bytes(store.path) / 2**20
        ivf_mb = folder_bytes(store.path / 'ivf') / 2**20
        vectors_mb = store_mb - ivf_mb
        tokens_mb = folder_bytes(tokens.path) / 2**20
        sizes = {names['bm25']: folder_bytes(bm25.path) / 2**20, names['exact']: vectors_mb,
                 names['tokens']: tokens_mb, names['pooled']: folder_bytes(index.path) / 2**20,
                 names['tokens+']: tokens_mb + vectors_mb, names['pooled+']: tokens_mb + vectors_mb,
                 names['kmeans']: store_mb}
        for first, second in zip(decoder_names[::2], decoder_names[1::2]):  # the same index as the token-level rows
            index_seconds.update({first: token_index_s, second: token_index_s})
            sizes.update({first: tokens_mb, second: tokens_mb + vectors_mb})
        for r in res.to_dict('records'):
            rows.append({'collection': name, 'system': r['name'], 'nDCG@10': r['nDCG@10'], 'R@100': r['R@100'],
                         'ms/query': r['mrt'], 'index s (after embedding)': index_seconds.get(r['name']),
                         'index MB': sizes[r['name']]})
        info['rows'] = [row for row in rows if row['collection'] == name]
        by = {row['system']: row for row in info['rows']}
        first, second = ('decoder', 'decoder+') if args.query == 'decoder' else ('tokens', 'tokens+')
        first, second = by[names[first]], by[names[second]]
        info['ratios'] = {
            'token nDCG@10 - exact': first['nDCG@10'] - by[names['exact']]['nDCG@10'],
            'exact ms / token ms': by[names['exact']]['ms/query'] / first['ms/query'],
            'token+rerank nDCG@10 - exact': second['nDCG@10'] - by[names['exact']]['nDCG@10'],
            'token+rerank R@100 - exact': second['R@100'] - by[names['exact']]['R@100'],
            'kmeans ms / token+rerank ms': by[names['kmeans']]['ms/query'] / second['ms/query'],
            'token+rerank R@100 - kmeans': second['R@100'] - by[names['kmeans']]['R@100'],
            'pooled nDCG@10 - exact': by[names['pooled']]['nDCG@10'] - by[names['exact']]['nDCG@10'],
            'kmeans index s / token index s': index_seconds[names['kmeans']] / token_index_s,
        }
        report['collections'][name] = info
        print(json.dumps({name: {k: v for k, v in info.items() if k != 'rows'}}, indent=1, default=str), flush=True)
        print(pd.DataFrame(info['rows']).round(4).to_string(index=False), flush=True)

    print(pd.DataFrame(rows).round(4).to_string(index=False))
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(report, indent=1, default=str))


if __name__ == '__main__':
    main()
