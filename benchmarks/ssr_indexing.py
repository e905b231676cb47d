"""SSR's index build against the k-means (ColBERTv2/PLAID-style) baseline at millions of token vectors, one run.

    nice -n 5 python benchmarks/ssr_indexing.py --tokens 5000000 --store runs/ssr/vaswani/store

Token vectors: a MaxSim store's real embeddings (``--store``, e.g. Vaswani's from ``benchmarks/ssr.py``) repeated
until ``--tokens`` rows, each copy with small seeded Gaussian noise and re-normalised (so k-means does not see exact
duplicates); without ``--store``, seeded unit-norm Gaussian vectors of ``--dim``.  Documents are cut every
``--doc-tokens`` rows.  Both builds start from the same float32 array in memory and write their files to
``--work-dir``:

* **SSR**: a TopK SAE (``--latents``, ``--k``, ``--sae-epochs``) on a seeded sample of ``--sample`` vectors, the
  codes of every token (:meth:`SSR.doc_codes`: ``--doc-k`` latents per token, default ``--k``), and the token
  postings (:class:`~pyterrier_lsr.index.ssr.SSRIndex`, ``latent -> (token, value)``) written to disk;
* **k-means**: faiss spherical k-means with ColBERTv2's centroid count ``2^floor(log2(16 sqrt(tokens)))``, 4
  iterations on PLAID's sample (the tokens of ``16 sqrt(120 x documents)`` documents), the assignment of every token
  to its nearest centroid, and the inverted lists (cell -> documents) written to disk.  One iteration and the
  assignment cost ``rows x centroids`` each; they are timed on ``--kmeans-timed-points`` rows with the full centroid
  count and scaled linearly to the sample (x 4 iterations) and to every token: the full build takes hours on a shared
  2-core machine.  The lists are built from random cell ids of the right size (their cost does not depend on them).

Prints each step's seconds and the ratio ``k-means s / SSR s``; writes JSON (``--output``).  One thread (``--threads``).
"""
import argparse
import json
import time
from pathlib import Path


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--tokens', type=int, default=5_000_000)
    parser.add_argument('--store', help='a MaxSim store whose vectors are repeated (default: synthetic vectors)')
    parser.add_argument('--dim', type=int, default=128, help='dimension of synthetic vectors')
    parser.add_argument('--doc-tokens', type=int, default=48)
    parser.add_argument('--latents', type=int, default=4096)
    parser.add_argument('--k', type=int, default=8)
    parser.add_argument('--doc-k', type=int, help="latents kept per token in the postings (SSR(doc_k=); default: --k)")
    parser.add_argument('--sample', type=int, default=200_000, help='vectors the SAE trains on')
    parser.add_argument('--sae-epochs', type=int, default=1, help='passes of the SAE over its sample')
    parser.add_argument('--kmeans-timed-points', type=int, default=100_000,
                        help='rows one k-means iteration and the assignment are timed on')
    parser.add_argument('--noise', type=float, default=0.05)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--threads', type=int, default=1)
    parser.add_argument('--work-dir', default='runs/ssr_indexing')
    parser.add_argument('--output', default='benchmarks/results/ssr_indexing.json')
    args = parser.parse_args()
    import faiss
    import numpy as np
    import torch

    from pyterrier_lsr.core import storage
    from pyterrier_lsr.index.maxsim import MaxSimIndex
    from pyterrier_lsr.index.ssr import POSTINGS_FILES, token_postings
    from pyterrier_lsr.kinds.ssr import token_codes, train_ssr_sae
    torch.set_num_threads(args.threads)
    faiss.omp_set_num_threads(args.threads)
    rng = np.random.default_rng(args.seed)
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)

    if args.store:
        base = MaxSimIndex(args.store).vectors().numpy()
        copies = -(-args.tokens // len(base))
        vectors = np.concatenate([base] * copies)[:args.tokens]
        vectors += rng.standard_normal(vectors.shape, dtype=np.float32) * (args.noise / np.sqrt(vectors.shape[1]))
        source = f'{args.store} x{copies} + noise {args.noise}'
    else:
        vectors = rng.standard_normal((args.tokens, args.dim), dtype=np.float32)
        source = 'unit Gaussian'
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    owner = np.arange(len(vectors)) // args.doc_tokens
    seconds = {}

    def timed(name, fn):
        start = time.perf_counter()
        out = fn()
        seconds[name] = time.perf_counter() - start
        print(f'{name}: {seconds[name]:.1f} s', flush=True)
        return out

    # SSR: SAE on a sample, codes of every token, token postings on disk.
    sae, log = timed('ssr_sae', lambda: train_ssr_sae(vectors, {'n_latents': args.latents, 'k': args.k,
                                                                'epochs': args.sae_epochs},
                                                      args.sample, verbose=False))
    codes = timed('ssr_codes', lambda: token_codes(sae.eval(), vectors, args.doc_k))

    def write_postings():
        indptr, tokens, values = token_postings(*codes, args.latents)
        with storage.build_folder(work / 'ssr', 'ssr_indexing_bench', overwrite=True) as tmp:
            for name, array in zip(POSTINGS_FILES, (indptr, tokens, values)):
                storage.write_array(tmp / name, array)
        return len(tokens)
    postings = timed('ssr_postings', write_postings)

    # k-means baseline: ColBERTv2's centroid count, 4 iterations on PLAID's sample, assignment, inverted lists.
    # An iteration costs points x centroids (one nearest-centroid search + the update), the assignment tokens x
    # centroids: both are timed on --kmeans-timed-points rows and scaled linearly (the whole run would take hours here).
    n_centroids = int(2 ** np.floor(np.log2(16 * np.sqrt(len(vectors)))))
    n_docs = int(owner[-1]) + 1
    sample = int(min(len(vectors), 16 * np.sqrt(120 * n_docs) * args.doc_tokens))  # PLAID: 16 sqrt(120 N) passages
    timed_rows = vectors[rng.choice(len(vectors), args.kmeans_timed_points, replace=False)]
    kmeans = faiss.Kmeans(vectors.shape[1], n_centroids, niter=1, seed=args.seed, spherical=True,
                          max_points_per_centroid=10 ** 9, min_points_per_centroid=1)
    timed('kmeans_1iter_timed', lambda: kmeans.train(timed_rows))
    timed('kmeans_assign_timed', lambda: kmeans.index.search(timed_rows, 1))
    seconds['kmeans_train'] = seconds['kmeans_1iter_timed'] / len(timed_rows) * sample * 4
    seconds['kmeans_assign'] = seconds['kmeans_assign_timed'] / len(timed_rows) * len(vectors)
    assigned = rng.integers(0, n_centroids, len(vectors))  # the lists' cost does not depend on which cell is which

    def write_lists():
        pairs = np.unique(np.stack([assigned, owner], 1), axis=0)
        with storage.build_folder(work / 'ivf', 'ssr_indexing_bench', overwrite=True) as tmp:
            storage.write_array(tmp / 'centroids.npy', kmeans.centroids.astype(np.float32))
            storage.write_array(tmp / 'codes.npy', assigned.astype(np.int32))
            storage.write_array(tmp / 'cell_offsets.npy', np.searchsorted(pairs[:, 0], np.arange(n_centroids + 1)))
            storage.write_array(tmp / 'cell_docs.npy', pairs[:, 1].astype(np.int32))
    timed('kmeans_lists', write_lists)

    ssr_s = seconds['ssr_sae'] + seconds['ssr_codes'] + seconds['ssr_postings']
    kmeans_s = seconds['kmeans_train'] + seconds['kmeans_assign'] + seconds['kmeans_lists']
    report = {'args': vars(args), 'source': source, 'tokens': len(vectors), 'dim': int(vectors.shape[1]),
              'n_centroids': n_centroids, 'kmeans_sample': sample, 'kmeans_extrapolated': True,
              'postings': postings, 'sae_fve': log[-1]['fve'], 'seconds': seconds, 'ssr_s': ssr_s,
              'kmeans_s': kmeans_s, 'kmeans_s / ssr_s': kmeans_s / ssr_s}
    print(json.dumps(report, indent=1))
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(report, indent=1))


if __name__ == '__main__':
    main()
