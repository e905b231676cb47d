"""The report itself: ``pt.Experiment`` plus the cost columns, written as a table (``report.md``, ``report.csv``) and
a plot (``report.png``)."""

from collections.abc import Sequence

import numpy as np
import pandas as pd
import pyterrier as pt
from tqdm.auto import tqdm

from ..core.storage import claim_folder, write_file, write_text
from .config import REPORT_KIND
from .costs import COST_COLUMNS, System, costs
from .plot import figure


def report(
    systems: Sequence[System],
    topics: pd.DataFrame,
    qrels: pd.DataFrame,
    measures: Sequence,
    output_dir,
    x: str = 'postings_per_query',
    title: str = '',
    passes: int = 3,
    notes: Sequence[str] = (),
) -> pd.DataFrame:
    """Runs ``pt.Experiment`` on ``systems``, adds cost columns (latencies over ``passes`` passes), writes
    ``report.md`` (the table, then ``notes``), ``report.csv`` and ``report.png`` (the first of ``measures`` vs ``x``,
    one numbered point per system) into ``output_dir``; returns the table.  ``output_dir`` must be new, empty or a
    report's (see :func:`~pyterrier_lsr.core.storage.claim_folder`): any other folder is refused before any work, so a
    user's own ``report.md`` is never replaced."""
    if not systems:
        raise ValueError('no systems to report on')
    if x not in COST_COLUMNS + tuple(str(m) for m in measures):
        raise ValueError(f'x={x!r} is not a report column; choose one of {list(COST_COLUMNS)} or a measure')
    output_dir = claim_folder(output_dir, REPORT_KIND, 'report folder')
    table = pt.Experiment(
        [s.pipeline() for s in systems], topics, qrels, list(measures), names=[s.name for s in systems]
    )
    cost_rows = [costs(s, topics, passes) for s in tqdm(systems, desc='measuring costs', unit='system')]
    table = pd.concat([table.reset_index(drop=True), pd.DataFrame(cost_rows)], axis=1)
    write_file(output_dir / 'report.csv', lambda tmp: table.to_csv(tmp, index=False))
    write_text(output_dir / 'report.md', _markdown(table) + ''.join(f'\n{note}\n' for note in notes))
    fig = figure(table, str(measures[0]), x, title)
    import matplotlib.pyplot as plt

    try:
        write_file(output_dir / 'report.png', lambda tmp: fig.savefig(tmp, format='png', dpi=120, bbox_inches='tight'))
    finally:
        plt.close(fig)
    return table


def _markdown(table: pd.DataFrame) -> str:
    cols = list(table.columns)
    lines = ['| ' + ' | '.join(cols) + ' |', '|' + '---|' * len(cols)]
    for row in table.itertuples(index=False):
        lines.append('| ' + ' | '.join(_cell(v) for v in row) + ' |')
    return '\n'.join(lines) + '\n'


def _cell(value) -> str:
    if isinstance(value, float):
        return '-' if np.isnan(value) else f'{value:.4g}'
    return str(value)

