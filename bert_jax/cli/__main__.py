import sys

from bert_jax.cli import main

sys.exit(main())
