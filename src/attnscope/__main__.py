import sys

from attnscope.cli.main import main

sys.exit(main())
