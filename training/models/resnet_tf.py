"""ResNet-18 in 3D (volumes) and 2D (images) for Keras 3 / TensorFlow: the same architecture
as resnet_torch (channels-last inputs, as stored)."""
from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import keras


def _block(layers: ModuleType, conv: Callable[..., keras.layers.Layer], x: keras.KerasTensor, filters: int,
           stride: int, name: str) -> keras.KerasTensor:
    shortcut = x
    y = conv(filters, 3, strides=stride, padding="same", use_bias=False, name=f"{name}_conv1")(x)
    y = layers.BatchNormalization(momentum=0.9, name=f"{name}_bn1")(y)
    y = layers.ReLU()(y)
    y = conv(filters, 3, padding="same", use_bias=False, name=f"{name}_conv2")(y)
    y = layers.BatchNormalization(momentum=0.9, name=f"{name}_bn2")(y)
    if stride != 1 or x.shape[-1] != filters:
        shortcut = conv(filters, 1, strides=stride, use_bias=False, name=f"{name}_down")(x)
        shortcut = layers.BatchNormalization(momentum=0.9, name=f"{name}_down_bn")(shortcut)
    return layers.ReLU()(layers.Add()([y, shortcut]))


def build(input_shape: tuple[int, ...], num_outputs: int, width: int = 64) -> keras.Model:
    """3D model for (X, Y, Z, C) inputs, 2D for (H, W, C); outputs are logits."""
    import keras
    from keras import layers

    inputs = keras.Input(shape=input_shape)
    if len(input_shape) == 4:
        conv, pool = layers.Conv3D, layers.GlobalAveragePooling3D
        x = conv(width, (7, 7, 3), strides=(2, 2, 1), padding="same", use_bias=False, name="stem")(inputs)
        x = layers.ReLU()(layers.BatchNormalization(momentum=0.9, name="stem_bn")(x))
    elif len(input_shape) == 3:
        conv, pool = layers.Conv2D, layers.GlobalAveragePooling2D
        x = conv(width, 7, strides=2, padding="same", use_bias=False, name="stem")(inputs)
        x = layers.ReLU()(layers.BatchNormalization(momentum=0.9, name="stem_bn")(x))
        x = layers.MaxPooling2D(3, strides=2, padding="same")(x)
    else:
        raise ValueError(f"no model for sample shape {input_shape}: need (X, Y, Z, C) volumes or (H, W, C) images")
    for i, mult in enumerate((1, 2, 4, 8)):
        x = _block(layers, conv, x, width * mult, 1 if i == 0 else 2, f"stage{i + 1}_a")
        x = _block(layers, conv, x, width * mult, 1, f"stage{i + 1}_b")
    outputs = layers.Dense(num_outputs, name="head")(pool()(x))
    return keras.Model(inputs, outputs, name="resnet18_3d" if len(input_shape) == 4 else "resnet18_2d")


def parameter_count(model: keras.Model) -> dict[str, int]:
    import numpy as np

    trainable = int(sum(np.prod(w.shape) for w in model.trainable_weights))
    non_trainable = int(sum(np.prod(w.shape) for w in model.non_trainable_weights))
    return {"trainable": trainable, "non_trainable": non_trainable, "total": trainable + non_trainable}
