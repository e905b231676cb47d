"""SAE training throughput and Latent Terms encoding speed against the dense model alone (one CPU thread).

    python benchmarks/sae.py --irds-cache PATH

* SAE training: vectors/s of ``train_sae`` over ``--vectors`` random unit-norm 384-d vectors (one epoch), for
  several widths, k and TopK/BatchTopK (the data only matters to the loss, not to the cost of a step).
* Encoding: docs/s over the first ``--docs`` Vaswani documents of the dense model alone (all-MiniLM-L6-v2, mean
  pooled: ``LatentTerms.embed`` in single mode) and of Latent Terms doc encoders (single and multi mode, SAE of
  ``--latents`` latents); the SAE is untrained, which costs the same as a trained one.  Best of ``--rounds``.

Prints a table and writes JSON (``--output``).
"""

import argparse
import json
import time
from pathlib import Path


def best_rate(fn, count, rounds):
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return count / min(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--irds-cache')
    parser.add_argument('--vectors', type=int, default=50_000)
    parser.add_argument('--docs', type=int, default=500)
    parser.add_argument('--latents', type=int, default=4096)
    parser.add_argument('--rounds', type=int, default=2)
    parser.add_argument('--output', default='runs/sae_benchmark.json')
    args = parser.parse_args()
    if args.irds_cache:
        from pyterrier_lsr.core.offline import use_irds_cache

        use_irds_cache(args.irds_cache)
    import pyterrier as pt
    import torch

    from pyterrier_lsr.kinds.latent_terms import LatentTerms
    from pyterrier_lsr.models.sae import SAEConfig, SparseAutoencoder, train_sae

    torch.set_num_threads(1)
    rows = []

    vectors = torch.nn.functional.normalize(
        torch.randn(args.vectors, 384, generator=torch.Generator().manual_seed(0)), dim=-1
    )
    for n_latents, k, batch_topk in [(4096, 16, False), (4096, 32, False), (16384, 16, False), (4096, 16, True)]:
        config = SAEConfig(d_in=384, n_latents=n_latents, k=k, batch_topk=batch_topk)
        rate = best_rate(lambda: train_sae(vectors, config, verbose=False), len(vectors), 1)
        rows.append(
            {
                'what': f'SAE training {n_latents} latents, k={k}{" BatchTopK" if batch_topk else ""}',
                'unit': 'vectors/s',
                'rate': round(rate),
            }
        )
        print(rows[-1], flush=True)

    docs = [d['text'] for _, d in zip(range(args.docs), pt.get_dataset('irds:vaswani').get_corpus_iter(verbose=False))]
    sae = SparseAutoencoder(SAEConfig(d_in=384, n_latents=args.latents, k=16))
    single = LatentTerms(sae=sae, mode='single')
    multi = LatentTerms(sae=sae, mode='multi')
    for name, fn in [
        ('dense all-MiniLM-L6-v2 alone (embed, mean-pooled)', lambda: single.embed(docs)),
        ('Latent Terms single-vector encode', lambda: single.encode(docs)),
        ('Latent Terms multi-vector encode', lambda: multi.encode(docs)),
    ]:
        fn()  # warm-up
        rows.append({'what': name, 'unit': 'docs/s', 'rate': round(best_rate(fn, len(docs), args.rounds), 1)})
        print(rows[-1], flush=True)

    import pandas as pd

    print(pd.DataFrame(rows).to_string(index=False))
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(rows, indent=1))


if __name__ == '__main__':
    main()
