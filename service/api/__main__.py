"""`python -m service.api`: serve with settings from `HTMLLM_*` environment variables."""

import sys

from service.api.main import main

if __name__ == "__main__":
    sys.exit(main())
