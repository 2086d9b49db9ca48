"""Small numeric helpers: one reads a device value back, one takes the position as a Python int."""


def normalize(x):
    scale = x.abs().max().item()  # HAZARD: host-sync
    return x / (scale + 1.0)  # HAZARD: baked-host-value


def normalize_on_device(x):
    return x / (x.abs().max() + 1.0)


def position_bias(x, pos: int):
    return x + 0.5 * pos  # HAZARD: baked-host-value


def position_bias_on_device(x, pos):
    return x + 0.5 * pos
