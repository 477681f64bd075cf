import sys

from sluice.cli.main import main

sys.exit(main())
