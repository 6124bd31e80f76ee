import sys

from inference_lab.cli import main

sys.exit(main())
