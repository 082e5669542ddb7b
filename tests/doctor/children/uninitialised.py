"""Child of test_doctor.py::test_doctor_reports_cpu_and_leaves_tensorflow_uninitialised."""

from child import emit

import memfit
from memfit.backend import tf as tfb
report = memfit.doctor()
data = report.to_dict()
data["initialised_after"] = tfb.is_initialized()
# Settings that must precede initialisation still work after doctor().
import tensorflow as tf
tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0],
    [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()])
data["logical_cpus"] = len(tf.config.list_logical_devices("CPU"))
emit(data)
