.PHONY: style quality test docs
style:
	ruff check --fix src tests examples benchmarks docs/conf.py docs/_ext && ruff format src tests examples benchmarks docs/conf.py docs/_ext
quality:
	ruff check src tests examples benchmarks docs/conf.py docs/_ext && ruff format --check src tests examples benchmarks docs/conf.py docs/_ext
test:
	HF_HUB_OFFLINE=1 python -m pytest tests
docs:
	sphinx-build -W --keep-going -b html docs docs/_build/html
