"""Sphinx configuration of pyterrier-lsr's pages for PyTerrier's documentation.

PyTerrier's documentation build copies this folder (``importlib.resources.files("pyterrier_lsr") / "pt_docs"`` of the
installed package) into its own tree and builds it with its own configuration; this file holds what the pages need
from that configuration, so that they also build alone, for a preview::

    pip install sphinx myst-parser
    sphinx-build pyterrier_lsr/pt_docs /tmp/pt_docs_html

The pages mix reStructuredText (``index.rst``, ``api.rst``) and Markdown (MyST), and ``api.rst`` documents the
installed package with autodoc, its docstrings written in Google style (Args/Returns/Raises, read by napoleon).
"""
import importlib.metadata

project = 'pyterrier-lsr'
author = 'pyterrier-lsr contributors'
try:
    release = importlib.metadata.version('pyterrier-lsr')
except importlib.metadata.PackageNotFoundError:  # the pages previewed from a checkout that is not installed
    release = ''
version = release

extensions = ['sphinx.ext.autodoc', 'sphinx.ext.napoleon', 'myst_parser']
source_suffix = {'.rst': 'restructuredtext', '.md': 'markdown'}
root_doc = master_doc = 'index'
exclude_patterns = ['_build']
autoclass_content = 'both'
napoleon_google_docstring = True
napoleon_numpy_docstring = False
