import sys

from perfladder.cli import main

sys.exit(main())
