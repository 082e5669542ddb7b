"""`python -m memfit.process JOB`: a memfit child process (see `memfit.process.runner`)."""

import sys

from memfit.process.child import main

if __name__ == "__main__":
    sys.exit(main(sys.argv))
