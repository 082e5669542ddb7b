"""Zoo: real models and datasets memfit's demo, benchmarks and tests train, built offline.

`memfit.zoo:retinanet` and `memfit.zoo:detection_samples` are factories the command line takes
(`memfit measure memfit.zoo:retinanet --data memfit.zoo:detection_samples`).
"""

from memfit.zoo.builders import detection_samples, retinanet, vit_classifier

__all__ = ["detection_samples", "retinanet", "vit_classifier"]
