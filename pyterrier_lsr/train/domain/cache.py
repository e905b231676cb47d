"""The cached data of a domain adaptation run: training examples with their teacher scores, and held-out
pseudo-queries with their pools and teacher rankings, one JSON file per corpus and data setting under the cache
folder (never pickle), so that a second run with other training settings goes straight to training."""
import json
import math
import random
from pathlib import Path

from ...core.storage import read_json, write_json
from .config import DomainConfig
from .queries import document_frequencies, make_queries
from .teacher import Teacher, cache_key, corpus_key, zscore_sum

# the fields of DomainConfig that change the data (the others change only the training)
DATA_SETTINGS = ('steps', 'batch_size', 'queries', 'per_doc', 'candidates', 'negatives', 'depth', 'pool', 'teachers',
                 'dense_teacher', 'teacher_scale', 'heldout', 'heldout_pool', 'heldout_corpus', 'seed')


def build_data(docs: dict[str, str], cache: Path, config: DomainConfig, verbose: bool = True) -> tuple[dict, bool]:
    """Training examples (with teacher scores) and held-out queries (with their pools and teacher ranks),
    cached as JSON under ``cache`` keyed by every setting that produces them; returns (data, cache_hit)."""
    settings = {k: getattr(config, k) for k in DATA_SETTINGS}
    settings['teachers'] = list(settings['teachers'])
    if 'latent' in config.teachers:  # only then does its base change the data (older caches keep their keys)
        settings['latent_teacher'] = config.latent_teacher
    path = Path(cache) / f'domain-data-{cache_key([corpus_key(docs), settings])}.json'
    if path.exists():
        return check_cached_data(read_json(path, 'the cached domain-adaptation data'), settings, docs, path), True
    rng = random.Random(config.seed)
    docnos = list(docs)
    rng.shuffle(docnos)
    heldout_docs = docnos[:config.heldout]
    wanted = math.ceil(config.steps * config.batch_size / config.per_doc)
    train_docs = docnos[config.heldout:config.heldout + wanted]
    if len(train_docs) < 2 or len(train_docs) * config.per_doc < config.batch_size:
        raise ValueError(f'corpus of {len(docs)} documents is too small for {config.heldout} held-out queries '
                         f'and batches of {config.batch_size}')
    df = document_frequencies(docs.values())
    teacher = Teacher(docs, cache, config, verbose)
    # the held-out queries are the same for every training setting (mixed styles), so arms compare on one yardstick
    heldout_q = make_queries(docs, heldout_docs, 'mixed', 1, random.Random(config.seed + 1), df)
    train_q = make_queries(docs, train_docs, config.queries, config.per_doc, rng, df)
    heldout = []
    pools, _ = teacher.pools(heldout_q, config.pool)
    for q, pool in zip(heldout_q, pools):
        fused = dict(zip(pool, zscore_sum(list(pool.values()), config.teachers)))
        ranked = sorted(pool, key=fused.get, reverse=True)
        heldout.append({'query': q['query'], 'pos': q['pos'], 'ranked': ranked[:config.heldout_pool]})
    pooled = {d for h in heldout for d in h['ranked']}
    others = [d for d in docs if d not in pooled]
    extra = random.Random(config.seed + 2).sample(others, min(len(others), max(0, config.heldout_corpus - len(pooled))))
    examples = []
    pools, bm25 = teacher.pools(train_q, max(config.pool, config.depth))
    for q, pool in zip(train_q, pools):
        pos_text = docs[q['pos']]
        others = [d for d in pool if d != q['pos'] and docs[d] != pos_text]
        if config.candidates == 'bm25':
            retrieved = bm25.get(q['qid'], {})
            ranked = [d for d in sorted(retrieved, key=retrieved.get, reverse=True) if d in others][:config.depth]
            negatives = rng.sample(ranked, min(config.negatives, len(ranked)))
        else:
            z = dict(zip(others, zscore_sum([pool[d] for d in others], config.teachers)))
            negatives = sorted(others, key=z.get, reverse=True)[:config.negatives]
        if len(negatives) < config.negatives:
            continue
        cands = [q['pos']] + negatives
        scores = config.teacher_scale * zscore_sum([pool[d] for d in cands], config.teachers)
        examples.append({'query': q['query'], 'pos': q['pos'], 'negatives': negatives, 'teacher': scores.tolist()})
    if len(examples) < config.batch_size:
        raise ValueError(f'only {len(examples)} pseudo-queries have {config.negatives} negatives '
                         f'(candidates={config.candidates!r}, pool={config.pool}, depth={config.depth}) in a corpus '
                         f'of {len(docs)} documents, fewer than batch_size={config.batch_size}: lower negatives or '
                         'batch_size')
    data = {'settings': settings, 'examples': examples, 'heldout': heldout, 'heldout_extra': extra}
    write_json(path, data, indent=None)
    return data, False


def _docnos(value, docs: dict) -> bool:
    """Whether ``value`` is a list of docnos of ``docs``."""
    return isinstance(value, list) and all(isinstance(v, str) and v in docs for v in value)


def check_cached_data(data: dict, settings: dict, docs: dict[str, str], path: Path) -> dict:
    """``data`` as :func:`build_data` wrote it for these ``settings`` and documents, or a ``ValueError`` naming
    ``path`` and the first entry that is not (a file edited or damaged since: every docno must be a document of the
    corpus, every teacher list one finite score per candidate), so that training never starts on it."""
    def bad(where: str):
        return ValueError(f'the cached domain-adaptation data {path} is damaged ({where}); remove the file and it is '
                          'built again')
    if set(data) != {'settings', 'examples', 'heldout', 'heldout_extra'} or \
            data['settings'] != json.loads(json.dumps(settings)):  # as JSON stores them: tuples are lists
        raise bad('its keys or settings are not those this run writes')
    if not isinstance(data['examples'], list) or not isinstance(data['heldout'], list) or \
            not _docnos(data['heldout_extra'], docs):
        raise bad('"examples" and "heldout" must be lists, "heldout_extra" docnos of the corpus')
    for i, e in enumerate(data['examples']):
        ok = isinstance(e, dict) and isinstance(e.get('query'), str) and _docnos([e.get('pos')], docs) and \
            _docnos(e.get('negatives'), docs) and isinstance(e.get('teacher'), list) and \
            len(e['teacher']) == 1 + len(e['negatives']) and \
            all(isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) for t in e['teacher'])
        if not ok:
            raise bad(f'examples[{i}]')
    for i, h in enumerate(data['heldout']):
        if not (isinstance(h, dict) and isinstance(h.get('query'), str) and _docnos([h.get('pos')], docs) and
                _docnos(h.get('ranked'), docs)):
            raise bad(f'heldout[{i}]')
    return data
