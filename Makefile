# The two commands of the README. Both set up what is missing first (idempotent).
#   make book   build the book; notebooks run the smoke config on CPU, the full config on a GPU
#   make test   run the test suite (CPU; GPU-only tests skip unless a GPU is present)
.PHONY: book test setup clean

book:
	@PY=$$(scripts/setup.sh | tail -n 1) && scripts/build_book.sh "$$PY"

# -n auto: two xdist workers on a CPU machine (tests/conftest.py decides; none with a GPU),
# each test file on one worker, in collection order (the files that read the smoke book last,
# tests/conftest.py); PYTEST_ARGS="-n 0" runs everything in one process.
# PERFLADDER_TEST_SHUFFLE=<seed> runs the tests before the book's readers in a shuffled order
# (a test that passes only after another fails); PERFLADDER_TEST_CPU=<file> writes each test's
# CPU seconds to <file> and the book build's to <file>.book (where the suite's time goes).
test:
	@PY=$$(scripts/setup.sh | tail -n 1) && "$$PY" -m pytest -n auto --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

setup:
	@scripts/setup.sh >/dev/null

clean:
	rm -rf _build
