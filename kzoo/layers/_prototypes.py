"""Layers passed as patterns: a layer keeps the config of the pattern and builds its own copies."""

import keras


def unbuilt_config(layer):
    """The serialized config of `layer` (or of an already serialized one) without its build state,
    so that each copy is built by its new owner, and without the id Keras' saving gives shared
    objects, so that each copy made while a file loads is a new layer; None for None."""
    if layer is None:
        return None
    config = layer if isinstance(layer, dict) else keras.layers.serialize(layer)
    return {key: value for key, value in config.items() if key not in ("build_config", "shared_object_id")}


def copy_layer(config, name, dtype):
    """A new, unbuilt layer from a pattern's `unbuilt_config`, named `name`, with the `dtype` policy."""
    config = unbuilt_config(config)
    return keras.layers.deserialize({**config, "config": {**config["config"], "name": name, "dtype": dtype}})


def deserialize_patterns(config, names):
    """A layer's `config` with its pattern entries `names` turned back into layers (for `from_config`)."""
    config = dict(config)
    for name in names:
        if isinstance(config.get(name), dict):
            config[name] = keras.layers.deserialize(unbuilt_config(config[name]))
    return config
