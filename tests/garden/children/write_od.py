"""Child of test_garden_task.py (the module fixture `od_data`): 8 generated detection records
of 128 px in `folder`, in the Object Detection API's TFRecord format.
"""

from child import arguments, emit

from memfit.data.synth import write_dataset

write_dataset(arguments()["folder"], count=8, shards=1, image_size=(128, 128), num_classes=5)
emit(True)
