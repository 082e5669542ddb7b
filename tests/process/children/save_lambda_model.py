"""Child of test_child_options.py (the lambda_file fixture): saves a model with a Lambda layer
to `path`.
"""

from child import arguments, emit

import option_models
option_models.save_lambda_model(arguments()["path"])
emit(1)
