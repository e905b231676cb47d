"""Wall time of the course kit (examples/course.py): a first run in an empty work folder, then a re-run that reuses
every model and index; both tables are kept, and what the trained systems' held-out selection decided.

    OMP_NUM_THREADS=1 python benchmarks/course.py --irds-cache PATH -- --docs 2000 --steps 60

Arguments after ``--`` go to examples/course.py.  Writes benchmarks/results/course.json.
"""
import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--irds-cache', help='a prepared ir_datasets cache (passed on to the script)')
    parser.add_argument('--output', default=str(ROOT / 'benchmarks' / 'results' / 'course.json'))
    parser.add_argument('course_args', nargs='*', help='arguments of examples/course.py')
    args = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as work:
        command = [sys.executable, str(ROOT / 'examples' / 'course.py'), '--workdir', work, *args.course_args]
        if args.irds_cache:
            command += ['--irds-cache', args.irds_cache]
        for run in ('first run', 're-run'):
            start = time.time()
            out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            runs.append({'run': run, 'seconds': round(time.time() - start, 1), 'table': out})
            print(f'{run}: {runs[-1]["seconds"]} s\n{out}')
        decisions = {log.parent.name: json.loads(log.read_text())['decision']
                     for log in sorted(Path(work).rglob('domain_adapt.json'))}
    print(json.dumps(decisions, indent=1))
    Path(args.output).write_text(json.dumps({'args': args.course_args, 'runs': runs, 'decisions': decisions},
                                            indent=1))


if __name__ == '__main__':
    main()
