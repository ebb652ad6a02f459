import sys

from machina.docs_reference import main

sys.exit(main())
