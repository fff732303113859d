import sys

from peer_rl.cli import main

sys.exit(main())
