import sys

from sglang_futuremap_patch.cli import main

sys.exit(main())
