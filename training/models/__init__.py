"""The models trained on the stores: ResNet-18 in 3D (volumes) and 2D (images), for each framework."""
