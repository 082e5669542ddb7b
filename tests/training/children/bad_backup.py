"""Child of test_backup.py::test_bad_backup_input_is_one_clear_error; its backup directories
go under `tmp`.
"""

from child import arguments, emit

import os
import memfit
import keras
import numpy as np
import tensorflow as tf
import factories
from memfit.training.checkpoint import BACKUP_FILE
tmp = arguments()["tmp"]
x = np.zeros((16, 64, 64, 3), "float32")
y = np.zeros(16, "int64")
model = factories.small_cnn()
errors = {}


def attempt(name, *args, **kwargs):
    try:
        memfit.fit(*args, verbose=0, **kwargs)
        errors[name] = None
    except memfit.MemfitError as e:
        errors[name] = str(e)


open(os.path.join(tmp, "afile"), "w").close()
attempt("file", model, x, y, batch_size=8, backup_dir=os.path.join(tmp, "afile"))
attempt("save_freq", model, x, y, batch_size=8, backup_dir=tmp + "/b", save_freq=0)
attempt("steps", model, x, y, batch_size=8, backup_dir=tmp + "/b", steps_per_epoch=1)
ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
attempt("infinite", model, ds.repeat(), backup_dir=tmp + "/b")
# A checkpoint of small_cnn, then another model on the same backup_dir.
import signal
from memfit.training.checkpoint import read_checkpoint
memfit.fit(model, x, y, batch_size=8, backup_dir=tmp + "/b", keep_backup=True, verbose=0)
errors["handler_after"] = signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
errors["kept"] = read_checkpoint(tmp + "/b").reason
path = os.path.join(tmp, "b", BACKUP_FILE)
with open(path, "rb") as f:
    before = f.read()
other = keras.Sequential([keras.Input((64, 64, 3)), keras.layers.Flatten(), keras.layers.Dense(3)])
other.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
attempt("other_model", other, x, y % 3, batch_size=8, backup_dir=tmp + "/b")
with open(path, "rb") as f:
    errors["untouched"] = f.read() == before
with open(path, "wb") as f:
    f.write(b"not a checkpoint")
attempt("damaged", model, x, y, batch_size=8, backup_dir=tmp + "/b")
emit(errors)
