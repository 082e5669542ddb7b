"""Child of test_tf_grappler.py: grappler's graph of the step under its cheaper config has the
nodes of the full one.
"""

from child import emit

import keras
from tensorflow.core.protobuf import config_pb2
from memfit.backend import tf as tfb, tf_grappler, tf_trace
from memfit.workload.workload import Workload

tf = tfb.import_tf()
inputs = keras.Input((16, 16, 3))
x = keras.layers.Conv2D(8, 3, padding="same")(inputs)
x = keras.layers.BatchNormalization()(x)
y = keras.layers.Activation("swish")(x)
x = keras.layers.Add()([x, y, keras.layers.Conv2D(8, 1)(y)])  # gradients summed by AddN
x = keras.layers.GlobalAveragePooling2D()(x)
model = keras.Model(inputs, keras.layers.Dense(4, activation="softmax")(x))
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
workload = Workload(model)
model.optimizer.build(model.trainable_variables)
concrete = tf.function(model.train_step).get_concrete_function(tf_trace.batch_specs(workload, 4))
graph_def = concrete.graph.as_graph_def()
fetches = [t.name for t in concrete.outputs]

used = []
chosen = tf_grappler.grappler_config
tf_grappler.grappler_config = lambda: used.append(1) or chosen()
cheaper = tf_grappler.grappler_graph(graph_def, fetches)
tf_grappler.grappler_config = config_pb2.ConfigProto  # TensorFlow's default
default = tf_grappler.grappler_graph(graph_def, fetches)

def plain(nodes):
    return {name: [n.rank, n.type, n.inputs] for name, n in nodes.items()}

emit({"used": len(used), "nodes": len(cheaper), "same": plain(cheaper) == plain(default)})
