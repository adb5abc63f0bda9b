import sys

from trainwise.cli import main

sys.exit(main())
