"""``lpips``: perceptual likeness to the sample's target image (the ``lpips`` package);
reward = -LPIPS distance, NaN without a ``target_image``.

Args: ``net`` (``alex`` | ``vgg`` | ``squeeze``, default alex); ``backbone_weights`` (a local
torchvision state dict of that network, e.g. ``alexnet-owt-7be5be79.pth``, loaded with
``weights_only=True``); ``pretrained_backbone`` (default true: without ``backbone_weights``,
torchvision's ImageNet weights from torch.hub's cache, ``$TORCH_HOME/hub/checkpoints/<file>``,
downloaded there once if absent; false = random backbone, for offline tests only); ``offload`` (keep
on CPU between calls). The linear heads ship inside the lpips wheel (no download).

The backbone is resolved when the reward is built (training startup, ``glm-grpo score``): a missing
file or a failed download is one line (:class:`RewardError`) naming the file, where it is looked for
and the two ways to provide it, not a traceback from deep inside torch.hub.
"""

from __future__ import annotations

import socket
import warnings
from pathlib import Path

import torch

from .base import TARGET_IMAGE, FrozenModel, stack_targets
from .registry import RewardError

# lpips' net name -> (torchvision builder, its ImageNet weights enum): what lpips itself loads
_BACKBONES = {
    "alex": ("alexnet", "AlexNet_Weights"),
    "vgg": ("vgg16", "VGG16_Weights"),
    "vgg16": ("vgg16", "VGG16_Weights"),  # lpips' alias
    "squeeze": ("squeezenet1_1", "SqueezeNet1_1_Weights"),
}
DOWNLOAD_TIMEOUT_S = 60  # urllib's default is none: a firewall that drops packets would hang startup


def backbone_file(net: str) -> tuple[str, Path]:
    """(download URL, cache path) of torchvision's ImageNet weights for lpips ``net``."""
    import torchvision.models as tv

    url = getattr(tv, _BACKBONES[net][1]).IMAGENET1K_V1.url
    return url, Path(torch.hub.get_dir()) / "checkpoints" / url.rsplit("/", 1)[-1]


def _how_to_provide(net: str, cache: Path) -> str:
    return (
        f"put {cache.name} in {cache.parent} (torch.hub's cache under $TORCH_HOME), or give the reward "
        f"args {{backbone_weights: /path/to/{cache.name}}} (a torchvision {_BACKBONES[net][0]} state dict)"
    )


def _read_state(path: Path, what: str) -> dict[str, torch.Tensor]:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - any unreadable file (zip, pickle, weights_only refusal): one line
        msg = " ".join(str(err).split())[:200]
        raise RewardError(
            f"reward lpips: {what} {path} cannot be read as a state dict ({type(err).__name__}: {msg})"
        ) from None


def _check_given_weights(net: str, backbone_weights) -> None:
    """One line unless ``net`` is lpips' and ``backbone_weights`` (when given) is a file."""
    if net not in _BACKBONES:
        raise RewardError(f"reward lpips: net={net!r} must be one of alex, vgg, squeeze")
    if backbone_weights is not None and not Path(str(backbone_weights)).expanduser().is_file():
        how = _how_to_provide(net, backbone_file(net)[1])
        raise RewardError(f"reward lpips: backbone_weights {backbone_weights} does not exist; {how}")


def load_backbone_state(net: str, backbone_weights: str | None) -> tuple[dict[str, torch.Tensor], Path]:
    """(torchvision state dict of the backbone, the file it came from): ``backbone_weights``, else
    torch.hub's cache, downloading into it once if absent. Any failure is a one-line :class:`RewardError`."""
    url, cache = backbone_file(net)
    if backbone_weights is not None:
        _check_given_weights(net, backbone_weights)
        path = Path(backbone_weights).expanduser()
        return _read_state(path, "backbone_weights"), path
    if not cache.is_file():
        previous = socket.getdefaulttimeout()
        socket.setdefaulttimeout(DOWNLOAD_TIMEOUT_S)
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            # torch.hub's own download: a temporary file moved into place when complete
            torch.hub.download_url_to_file(url, str(cache), progress=False)
        except OSError as err:  # URLError, HTTPError, timeouts, a cache directory that cannot be written
            reason = " ".join(str(getattr(err, "reason", None) or err).split())[:200]
            raise RewardError(
                f"reward lpips: torchvision's {net} backbone weights {cache.name} are not in {cache.parent} and "
                f"downloading {url} failed ({reason}); {_how_to_provide(net, cache)}"
            ) from None
        finally:
            socket.setdefaulttimeout(previous)
    return _read_state(cache, "torch.hub's cached"), cache


def load_backbone(model, net: str, state: dict[str, torch.Tensor], source: Path) -> None:
    """Copy a torchvision ``features.<i>.*`` state dict into lpips' sliced backbone (``slice<k>.<i>.*``:
    lpips keeps torchvision's layer indices), refusing a file of another architecture."""
    if not isinstance(state, dict):
        raise RewardError(f"reward lpips: {source} holds a {type(state).__name__}, not a torchvision state dict")
    features = {key[len("features.") :]: value for key, value in state.items() if key.startswith("features.")}
    wanted = model.net.state_dict()
    mapped = {key: features.get(key.split(".", 1)[1]) for key in wanted}
    bad = [key for key, value in mapped.items() if value is None or value.shape != wanted[key].shape]
    if bad:
        raise RewardError(
            f"reward lpips: {source} is not a torchvision {_BACKBONES[net][0]} state dict "
            f"(features.{bad[0].split('.', 1)[1]} missing or of another shape); use the weights of net={net}"
        )
    model.net.load_state_dict(mapped)


class LPIPSReward:
    needs = TARGET_IMAGE  # undefined (NaN) for samples without it

    @staticmethod
    def check_args(args: dict) -> None:
        """The backbone weights a run was given exist (torch.hub's cache is read, or downloaded, when built)."""
        _check_given_weights(args.get("net", "alex"), args.get("backbone_weights"))

    def __init__(
        self,
        net: str = "alex",
        pretrained_backbone: bool = True,
        backbone_weights: str | None = None,
        offload: bool = False,
    ):
        import lpips

        _check_given_weights(net, None)  # the net; a given file is checked where it is read
        if backbone_weights is not None and not pretrained_backbone:
            raise RewardError(
                "reward lpips: backbone_weights and pretrained_backbone: false contradict each other; give one"
            )
        # The backbone first: a missing file fails before anything is built.
        state, self.backbone_file = load_backbone_state(net, backbone_weights) if pretrained_backbone else (None, None)
        # pretrained=True loads the linear heads shipped inside the lpips wheel; pnet_rand=True keeps
        # lpips from fetching the backbone itself (torchvision's download, a traceback offline).
        with warnings.catch_warnings():
            # lpips builds it through torchvision's deprecated `pretrained=` argument: nothing a user can act on
            warnings.filterwarnings("ignore", category=UserWarning, module=r"torchvision\.models\._utils")
            model = lpips.LPIPS(net=net, pretrained=True, pnet_rand=True, verbose=False)
        if state is not None:
            load_backbone(model, net, state, self.backbone_file)
        self.model = FrozenModel(model, offload)

    def distance(self, images: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """``[N]`` LPIPS distances between images in [0, 1]."""
        with self.model.on(images.device) as m:
            return m(images.float() * 2 - 1, targets.float() * 2 - 1).reshape(-1)

    def __call__(self, images: torch.Tensor, prompts: list[str], samples: list[dict]) -> torch.Tensor:
        targets, has = stack_targets(samples, images.shape[2], images.shape[3], images.device)
        out = torch.full((images.shape[0],), float("nan"), device=images.device)
        if has.any():
            out[has] = -self.distance(images[has], targets[has])
        return out
