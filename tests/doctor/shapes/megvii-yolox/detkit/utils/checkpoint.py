import logging

log = logging.getLogger(__name__)


def copy_matching(net, saved):
    own = net.state_dict()
    usable = {}
    for name, tensor in own.items():
        if name not in saved:
            log.warning("%s missing from the saved weights", name)
            continue
        if saved[name].shape != tensor.shape:
            log.warning("%s: saved %s, network %s", name, tuple(saved[name].shape), tuple(tensor.shape))
            continue
        usable[name] = saved[name]
    net.load_state_dict(usable, strict=False)  # silent: TW302
    return net
