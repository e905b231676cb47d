"""Does SAE-SPLADE lose to SPLADE by weighting every token alike?  A diagnostic, no training (issue #29, item 4).

A TopK SAE gives every token state k latents, a stopword's as strong as a rare word's; SPLADE's MLM head learned which
tokens matter.  This script pools a trained SAE-SPLADE model's token latents with a per-token gate ``g_i``,

    ``v_j = log(1 + max_i g_i^p z_ij)``

where ``g_i`` is one of SPLADE-tiny's (its MLM head, zero-shot) weights of token ``i``, ``log(1 + relu(logit))``:
``self`` (of the token's own wordpiece at its position), ``pool`` (the text's SPLADE vector at that wordpiece),
``max`` (the position's strongest term), or ``mask`` (``self > 0``: the positions whose wordpiece SPLADE drops), or
``idf``, the wordpiece's idf over the corpus (no head); ``none`` is the model as it is.  ``latent`` weighs latents, not
tokens: ``v_j = u_j^p log(1 + max_i z_ij)`` with ``u_j`` the activation-weighted mean ``self`` gate of the corpus
tokens that activate latent ``j`` (what the model's per-latent weight ``w`` could be set to; mean 1).
``--docs-only`` gates the documents only.  Each arm is scored plain and with idf query latents (as
:func:`~pyterrier_lsr.kinds.sae_splade.idf_weighted_queries`, from the arm's own document frequencies), by
exhaustive dot products (small collections):

* held-out first-stage nDCG@10 and MRR on the held-out pseudo-queries of a domain-adaptation cache (what chooses; no
  test topic): ``--heldout-data``, the ``domain-data-*.json`` in ``benchmarks/sae_queries.py``'s ``--cache-dir``;
* test nDCG@10, AP, R@100, postings per query (summed document frequencies of its latents) and terms per text;
* the same for SPLADE-tiny's own vectors (zero-shot), for scale.

    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/sae_splade_gates.py --collection path/to/cisi \\
        --model runs/sae_cisi/sae/model --heldout-data runs/cache/cisi/domain-data-<key>.json \\
        --output benchmarks/results/sae_splade_gates_cisi.json

Documents are encoded at 256 tokens (the indexers' default) for both the held-out sub-corpus and the test, queries
at 64.  One CPU thread.  Prints one JSON line per arm and a table, and writes JSON (``--output``).
"""
import argparse
import json
import time
from collections import Counter

GATES = ('none', 'self', 'pool', 'max', 'mask', 'idf', 'latent')


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--collection', required=True, help='irds:<id> or a folder (docs.jsonl, topics, qrels)')
    p.add_argument('--model', required=True, help='a trained SAE-SPLADE folder (sae_queries.py: <workdir>/sae/model)')
    p.add_argument('--heldout-data', required=True, help="a domain-adaptation cache's domain-data-*.json")
    p.add_argument('--splade', default='splade-tiny', help='the MLM model whose head gives the gates')
    p.add_argument('--arms', nargs='+', default=['none:1', 'self:1', 'pool:1', 'max:1', 'self:0.5', 'pool:0.5',
                                                 'mask:1', 'idf:0.5', 'self:0.25', 'latent:1', 'latent:0.5',
                                                 'latent:2'],
                   help=f'gate:power pairs, gate one of {GATES}')
    p.add_argument('--docs-only', nargs='*', default=['pool:1', 'mask:1'], help='arms also run with ungated queries')
    p.add_argument('--irds-cache')
    p.add_argument('--output', default='benchmarks/results/sae_splade_gates.json')
    args = p.parse_args()
    arms = [(gate, float(power), False) for gate, power in (a.split(':') for a in args.arms)]
    arms += [(gate, float(power), True) for gate, power in (a.split(':') for a in args.docs_only)]
    if any(gate not in GATES for gate, _, _ in arms):
        p.error(f'gates must be among {GATES}')
    if args.irds_cache:
        from pyterrier_lsr.core.offline import use_irds_cache
        use_irds_cache(args.irds_cache)
    import ir_measures
    import torch
    from ir_measures import AP, R, nDCG
    from transformers import AutoModelForMaskedLM

    from pyterrier_lsr import load_model
    from pyterrier_lsr.core.collection import load_collection
    from pyterrier_lsr.core.offline import resolve_model
    from pyterrier_lsr.core.storage import read_json, write_json
    from pyterrier_lsr.models.sae_splade import latent_idf
    from pyterrier_lsr.train.domain.heldout import rank_measures
    torch.set_num_threads(1)

    collection = load_collection(args.collection)
    docnos = [d['docno'] for d in collection.corpus]
    texts = {d['docno']: d['text'] for d in collection.corpus}
    sae = load_model(args.model)
    model, tokenizer = sae.model.eval(), sae.tokenizer
    mlm = AutoModelForMaskedLM.from_pretrained(str(resolve_model(args.splade))).eval()
    n_latents = model.sae.n_latents

    wordpiece_df = Counter(str(i) for text in texts.values()
                           for i in set(tokenizer(text, truncation=True, max_length=256)['input_ids']))
    wordpiece_idf = latent_idf(wordpiece_df, len(texts), [str(i) for i in range(len(tokenizer))])
    wordpiece_idf /= wordpiece_idf[[int(i) for i in wordpiece_df]].mean()  # mean 1 over the corpus's wordpieces

    @torch.inference_mode()
    def token_parts(batch_texts, max_length, batch_size=32):
        """Per text: its tokens' latents and values (the model's token_latents), each gate per token, and its
        SPLADE-tiny vector."""
        out = [None] * len(batch_texts)
        order = sorted(range(len(batch_texts)), key=lambda i: len(batch_texts[i]))
        for start in range(0, len(order), batch_size):
            ids = order[start:start + batch_size]
            enc = tokenizer([batch_texts[i] for i in ids], padding=True, truncation=True, max_length=max_length,
                            return_tensors='pt')
            indices, values, owner = model.token_latents(enc.input_ids, enc.attention_mask)
            mask = model.features.token_mask(enc.input_ids, enc.attention_mask)
            weights = torch.log1p(torch.relu(mlm(input_ids=enc.input_ids, attention_mask=enc.attention_mask).logits))
            splade = (weights * enc.attention_mask[..., None]).max(1).values
            wordpieces = enc.input_ids[mask]
            own = weights[mask].gather(1, wordpieces[:, None])[:, 0]
            gates = {'self': own, 'pool': splade[owner, wordpieces], 'max': weights[mask].max(-1).values,
                     'mask': (own > 0).float(), 'idf': wordpiece_idf[wordpieces]}
            for b, i in enumerate(ids):
                mine = owner == b
                out[i] = (indices[mine], values[mine], {name: g[mine] for name, g in gates.items()},
                          splade[b].to_sparse())
        return out

    def pooled(parts, gate, power):
        rows = []
        for indices, values, gates, _ in parts:
            weighted = values if gate in ('none', 'latent') else values * gates[gate][:, None] ** power
            rows.append(torch.log1p(torch.zeros(n_latents).scatter_reduce(0, indices.flatten(), weighted.flatten(),
                                                                          'amax')))
        rows = torch.stack(rows)
        return rows * latent_weight ** power if gate == 'latent' else rows

    data = read_json(args.heldout_data, 'the domain-adaptation data')
    heldout = data['heldout']
    sub_corpus = sorted({d for h in heldout for d in h['ranked']} | set(data['heldout_extra']))
    position = {d: i for i, d in enumerate(docnos)}
    start = time.time()
    doc_parts = token_parts([texts[d] for d in docnos], 256)
    topic_parts = token_parts(list(collection.topics['query']), 64)
    heldout_parts = token_parts([h['query'] for h in heldout], 64)
    encode_s = time.time() - start
    mass, gated = torch.zeros(n_latents, dtype=torch.float64), torch.zeros(n_latents, dtype=torch.float64)
    for indices, values, gates, _ in doc_parts:
        mass.index_add_(0, indices.flatten(), values.flatten().double())
        gated.index_add_(0, indices.flatten(), (values * gates['self'][:, None]).flatten().double())
    latent_weight = torch.where(mass > 0, gated / mass.clamp(min=1e-12), 0).float()
    latent_weight /= latent_weight[mass > 0].mean()
    qrels = [ir_measures.Qrel(str(r.qid), str(r.docno), int(r.label)) for r in collection.qrels.itertuples()]

    def measure(docs, topics, pseudo):
        posted = docs > 0
        row = {'doc_terms': float(posted.sum(1).float().mean())}
        n, sub = len(docs), docs[[position[d] for d in sub_corpus]]
        df = {str(j): int(count) for j, count in enumerate(posted.sum(0).tolist())}
        for weighing in ('plain', 'idf'):
            # the idf query latents of idf_weighted_queries, from this arm's own document frequencies
            w = latent_idf(df, n, list(df)) if weighing == 'idf' else torch.ones(docs.shape[1])
            scores = (topics * w) @ docs.t()
            top = scores.topk(min(1000, n))
            run = [ir_measures.ScoredDoc(str(qid), docnos[j], s)
                   for qid, values, columns in zip(collection.topics['qid'], top.values.tolist(), top.indices.tolist())
                   for s, j in zip(values, columns)]
            test = ir_measures.calc_aggregate([nDCG @ 10, AP, R @ 100], qrels, run)
            held = (pseudo * w) @ sub.t()
            rankings = [[sub_corpus[j] for j in torch.argsort(-held[i], stable=True).tolist()]
                        for i in range(len(heldout))]
            held_out = rank_measures(rankings, [h['ranked'] for h in heldout], [h['pos'] for h in heldout])
            used = (topics * w) > 0
            row[weighing] = {'heldout_first_ndcg': held_out['ndcg'], 'heldout_first_mrr': held_out['mrr'],
                             'nDCG@10': test[nDCG @ 10], 'AP': test[AP], 'R@100': test[R @ 100],
                             'postings_per_query': float((used.float() @ posted.float().t()).sum(1).mean()),
                             'query_terms': float(used.sum(1).float().mean())}
        return row

    rows = []
    splade = [torch.stack([part[3].to_dense() for part in parts]) for parts in (doc_parts, topic_parts, heldout_parts)]
    named = [('SPLADE-tiny zero-shot', None)] + [
        (f'{gate}^{power:g}' + (', documents only' if docs_only else ''), (gate, power, docs_only))
        for gate, power, docs_only in arms]
    for name, arm in named:
        if arm is None:
            vectors = splade
        else:
            gate, power, docs_only = arm
            query_gate = 'none' if docs_only else gate
            vectors = [pooled(doc_parts, gate, power), pooled(topic_parts, query_gate, power),
                       pooled(heldout_parts, query_gate, power)]
        row = {'arm': name, **measure(*vectors)}
        print(json.dumps(row), flush=True)
        rows.append(row)
    table = [(r['arm'], weighing, r[weighing]['heldout_first_ndcg'], r[weighing]['nDCG@10'],
              r[weighing]['postings_per_query'], r['doc_terms']) for r in rows for weighing in ('plain', 'idf')]
    print(f"{'arm':34} {'queries':7} {'held-out':>8} {'nDCG@10':>8} {'postings':>9} {'doc terms':>9}")
    for arm, weighing, held, ndcg, postings, terms in table:
        print(f'{arm:34} {weighing:7} {held:8.3f} {ndcg:8.3f} {postings:9.0f} {terms:9.1f}')
    write_json(args.output, {'collection': collection.name, 'args': vars(args), 'encode_s': encode_s,
                             'heldout_queries': len(heldout), 'heldout_sub_corpus': len(sub_corpus), 'rows': rows,
                             'date': time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})


if __name__ == '__main__':
    main()
