.PHONY: style quality test
style:
	ruff check --fix src tests examples benchmarks && ruff format src tests examples benchmarks
quality:
	ruff check src tests examples benchmarks && ruff format --check src tests examples benchmarks
test:
	HF_HUB_OFFLINE=1 python -m pytest tests
