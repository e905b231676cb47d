"""Latent Terms over all-MiniLM-L6-v2 on Vaswani (or a LIMIT-style collection): dense vs BM25 vs Latent Terms.

    python examples/latent_terms.py --irds-cache PATH
    python examples/latent_terms.py --limit runs/limit        # a collection written by examples/make_limit.py

Each setting ``mode:n_latents:k[:sqrt][:batch][:e<epochs>]`` (e.g. ``multi:4096:16:sqrt:e3``: square-root TFs,
3 epochs; ``batch``: BatchTopK) trains an SAE on the cached embeddings of the corpus and indexes its latents; dense
is exhaustive cosine over the same cached (single-mode) embeddings.  Trained models and their indexes are kept under
``--workdir`` and reused by later runs.  Writes the latent vocabulary's document-frequency plot (rank vs df,
log-log) of the first setting to ``--plot``.
"""

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd
from pyterrier.measures import AP, R, nDCG

MEASURES = [nDCG @ 10, AP, R @ 10, R @ 100]


def load_collection(args):
    """``(docs, topics, qrels)`` DataFrames of Vaswani or of a make_limit.py folder (a collection of plain files)."""
    from pyterrier_lsr import load_collection

    collection = load_collection(args.limit or 'irds:vaswani')
    return pd.DataFrame(collection.corpus, columns=['docno', 'text']), collection.topics, collection.qrels


def dense_run(latent_terms, docs, topics, cache_dir, k=1000):
    """Exhaustive cosine of mean-pooled normalised embeddings (the dense model alone)."""
    from pyterrier_lsr.kinds.latent_terms import cached_embeddings

    doc_vecs, offsets = cached_embeddings(latent_terms, docs['text'].tolist(), cache_dir)
    query_vecs, _ = latent_terms.embed(topics['query'].tolist())
    scores = query_vecs @ np.asarray(doc_vecs).T
    rows = []
    for qid, row in zip(topics['qid'], scores):
        top = np.argsort(-row)[:k]
        rows += [
            {'qid': qid, 'docno': docs['docno'].iloc[i], 'score': float(row[i]), 'rank': r} for r, i in enumerate(top)
        ]
    return pd.DataFrame(rows)


def parse_setting(text, epochs):
    mode, n_latents, k, *rest = text.split(':')
    epochs = next((int(r[1:]) for r in rest if r.startswith('e')), epochs)
    sae = {'n_latents': int(n_latents), 'k': int(k), 'epochs': epochs, 'batch_topk': 'batch' in rest}
    return {'mode': mode, 'sae': sae, 'sqrt_tf': 'sqrt' in rest}


def df_plot(index, path, title):
    import matplotlib

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    df = np.sort(np.array(list(index.document_frequencies().values())))[::-1]
    ranks = np.arange(1, len(df) + 1)
    slope = np.polyfit(np.log(ranks), np.log(df), 1)[0]
    fig, ax = plt.subplots(figsize=(5, 4))
    ax.loglog(ranks, df, '.', markersize=2)
    ax.set_xlabel('latent rank')
    ax.set_ylabel('document frequency')
    ax.set_title(f'{title}\nlog-log slope {slope:.2f}', fontsize=9)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return slope


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--irds-cache', help='a prepared ir_datasets cache (copied to a temporary folder)')
    parser.add_argument('--limit', help='a LIMIT-style folder from examples/make_limit.py instead of Vaswani')
    parser.add_argument('--settings', nargs='+', default=['single:4096:16', 'multi:4096:16:sqrt'])
    parser.add_argument(
        '--epochs', type=int, default=20, help='SAE epochs (over at most --max-train vectors) unless set per setting'
    )
    parser.add_argument('--max-train', type=int, default=100_000)
    parser.add_argument('--k1', type=float, default=1.5)
    parser.add_argument('--b', type=float, default=0.75)
    parser.add_argument('--workdir', default='runs/latent_terms')
    parser.add_argument('--plot', default='benchmarks/results/latent_terms_df.png')
    parser.add_argument('--output', help='JSON results file')
    args = parser.parse_args()
    from pyterrier_lsr.core.extras import require_extra, require_models
    require_models('all-MiniLM-L6-v2')  # before any work: the dense base, and the plot drawn last
    require_extra('report', 'matplotlib', needed_for='the plot')
    if args.irds_cache:
        from pyterrier_lsr.core.offline import use_irds_cache

        use_irds_cache(args.irds_cache)
    import pyterrier as pt
    import pyterrier_pisa
    import torch

    from pyterrier_lsr import LsrIndex
    from pyterrier_lsr.kinds.latent_terms import LatentTerms
    from pyterrier_lsr.train import build_latent_terms

    torch.set_num_threads(1)
    docs, topics, qrels = load_collection(args)
    name = Path(args.limit).name if args.limit else 'vaswani'
    workdir = Path(args.workdir) / name
    cache = workdir / 'embeddings'
    systems, names, extra = [], [], []

    bm25_path = workdir / 'bm25.pisa'
    bm25_index = pyterrier_pisa.PisaIndex(str(bm25_path), text_field='text')
    if not bm25_index.built():
        bm25_index.index(docs.to_dict('records'))
    systems.append(bm25_index.bm25(k1=args.k1, b=args.b))
    names.append('BM25 (PISA, text)')
    extra.append({})
    systems.append(dense_run(LatentTerms(mode='single'), docs, topics, cache))
    names.append('dense all-MiniLM-L6-v2 (exhaustive cosine)')
    extra.append({})

    for i, text in enumerate(args.settings):
        setting = parse_setting(text, args.epochs)
        path = workdir / f'lt.{text.replace(":", "_")}'
        if (path / 'log.json').exists():  # trained and indexed by an earlier run (the index holds its model)
            index, log = LsrIndex(path / 'index'), json.loads((path / 'log.json').read_text())
        else:
            _, index, log = build_latent_terms(
                docs.to_dict('records'),
                path / 'index',
                cache_dir=cache,
                max_train_vectors=args.max_train,
                overwrite=True,
                **setting,
            )
            (path / 'log.json').write_text(json.dumps(log))
        df = index.document_frequencies()
        postings = sum(df.values())
        extra.append(
            {
                'fve': round(log[-1]['fve'], 3),
                'dead': round(log[-1]['dead'], 3),
                'train_s': round(log[-1]['seconds'], 1),
                'latents_used': len(df),
                'terms/doc': round(postings / index.num_docs(), 1),
            }
        )
        systems.append(index.retriever(k1=args.k1, b=args.b))
        names.append(f'Latent Terms {text}')
        if i == 0:
            extra[-1]['df_slope'] = round(
                df_plot(index, args.plot, f'{name}: Latent Terms {text}, df of {len(df)} latents'), 2
            )

    res = pt.Experiment(systems, topics, qrels, MEASURES, names=names)
    res = pd.concat([res, pd.DataFrame(extra)], axis=1)
    with pd.option_context('display.width', 250, 'display.max_columns', 20):
        print(res.to_string(index=False))
    if args.output:
        Path(args.output).write_text(json.dumps(res.to_dict('records'), indent=1, default=str))


if __name__ == '__main__':
    main()
