"""Child of test_backup.py::test_resume_keeps_k_per_input_shape_without_a_new_recovery: fits
factories.detector_cnn on factories.box_dataset for `epochs` with a backup in `backup`.
"""

from child import arguments, emit

ARGS = arguments()
import memfit
from factories import box_dataset, detector_cnn
model = detector_cnn()
history = memfit.fit(model, box_dataset(), epochs=ARGS["epochs"], verbose=0,
                     backup_dir=ARGS["backup"], keep_backup=True)
emit(dict(summary=history.memfit.to_dict(), iterations=int(model.optimizer.iterations)))
