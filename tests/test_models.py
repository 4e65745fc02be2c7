"""Model registry: parameter counts against the papers, shapes, size limits, model files."""
import pytest

from minidnn import models
from minidnn.errors import ConfigError


def conv_params(c_in, c_out, k, groups=1):
    return c_out * (c_in // groups) * k * k + c_out


def fc_params(n_in, n_out):
    return n_in * n_out + n_out


def test_alexnet_parameter_count_matches_caffe():
    net = models.build("alexnet", num_classes=1000, image_size=227)
    assert net.num_params() == 60_965_224
    # Cross-check the layer by layer sum (groups 2 on conv2, conv4, conv5; fc6 reads 256*6*6).
    expected = (conv_params(3, 96, 11) + conv_params(96, 256, 5, 2) + conv_params(256, 384, 3)
                + conv_params(384, 384, 3, 2) + conv_params(384, 256, 3, 2)
                + fc_params(256 * 6 * 6, 4096) + fc_params(4096, 4096) + fc_params(4096, 1000))
    assert net.num_params() == expected


def test_overfeat_fast_parameter_count():
    # OverFeat fast at 231x231: maps 56 -> pool 28 -> conv2 (5x5, no pad) 24 -> pool 12 -> 12
    # -> pool 6, so fc6 reads 1024*6*6 = 36,864 values.
    #   conv1    96*3*11*11    + 96   =      34,944
    #   conv2   256*96*5*5     + 256  =     614,656
    #   conv3   512*256*3*3    + 512  =   1,180,160
    #   conv4  1024*512*3*3    + 1024 =   4,719,616
    #   conv5  1024*1024*3*3   + 1024 =   9,438,208
    #   fc6   36864*3072       + 3072 = 113,249,280
    #   fc7    3072*4096       + 4096 =  12,587,008
    #   fc8    4096*1000       + 1000 =   4,097,000
    #   total                           145,920,872  (the paper's table 1: about 145.9M)
    net = models.build("overfeat", num_classes=1000, image_size=231)
    assert net.num_params() == 145_920_872
    assert net.shapes["pool5"] == (1, 1024, 6, 6)


def test_vgg16_parameter_count():
    assert models.build("vgg16", num_classes=1000, image_size=224).num_params() == 138_357_544
    assert models.vgg(16).num_params() == 138_357_544


def test_vgg19_is_configuration_e():
    assert models.stage_depths(19) == (2, 2, 4, 4, 4)
    assert models.build("vgg19").num_params() == 143_667_240


def test_deep_vgg_parameter_count():
    # VGG-116 = VGG-16 + 100 extra 3x3 convs, 20 per stage, each keeping its stage's width:
    # 20*(64*64*9+64) + 20*(128*128*9+128) + 20*(256*256*9+256) + 40*(512*512*9+512)
    # = 738,560 + 2,951,680 + 11,801,600 + 94,392,320 = 109,884,160 more than VGG-16.
    assert models.stage_depths(116) == (22, 22, 23, 23, 23)
    net = models.build("vgg116", num_classes=1000, image_size=224)
    assert net.num_params() == 138_357_544 + 109_884_160 == 248_241_704
    convs = [n for n in net.nodes if n.layer.kind == "conv"]
    assert len(convs) == 113


@pytest.mark.parametrize("depth,counts", [(11, (1, 1, 2, 2, 2)), (13, (2, 2, 2, 2, 2)),
                                          (16, (2, 2, 3, 3, 3)), (18, (2, 2, 3, 4, 4)),
                                          (216, (42, 42, 43, 43, 43)),
                                          (416, (82, 82, 83, 83, 83))])
def test_vgg_stage_distribution(depth, counts):
    assert models.stage_depths(depth) == counts
    assert sum(counts) + 3 == depth


def test_vgg416_builds_with_the_right_depth():
    net = models.build("vgg416", num_classes=10, image_size=32)
    assert sum(n.layer.kind == "conv" for n in net.nodes) == 413
    assert sum(n.layer.kind == "linear" for n in net.nodes) == 3


def test_alexnet_shapes_at_native_and_reduced_size():
    net = models.build("alexnet", num_classes=1000, image_size=227)
    s = net.shapes
    assert s["conv1"] == (1, 96, 55, 55) and s["pool1"] == (1, 96, 27, 27)
    assert s["conv2"] == (1, 256, 27, 27) and s["pool2"] == (1, 256, 13, 13)
    assert s["conv5"] == (1, 256, 13, 13) and s["pool5"] == (1, 256, 6, 6)
    assert s["fc8"] == (1, 1000)
    small = models.build("alexnet", num_classes=10, image_size=64)
    small.infer_shapes(4)
    assert small.shapes["conv1"] == (4, 96, 14, 14)
    assert small.shapes["pool1"] == (4, 96, 7, 7)      # Caffe's rounding up: (14-3)/2 -> 6 -> 7
    assert small.shapes["pool5"] == (4, 256, 1, 1)
    assert small.shapes["fc8"] == (4, 10)


def test_overfeat_and_vgg_shapes_at_reduced_size():
    net = models.build("overfeat", num_classes=7, image_size=96)
    net.infer_shapes(2)
    # (96 - 11) // 4 + 1 = 22 -> pool 11 -> 5x5 conv 7 -> pool 3 -> 3 -> 3 -> 3 -> pool 1
    assert net.shapes["conv1"] == (2, 96, 22, 22)
    assert net.shapes["conv2"] == (2, 256, 7, 7)
    assert net.shapes["pool2"] == (2, 256, 3, 3)
    assert net.shapes["pool5"] == (2, 1024, 1, 1)
    assert net.shapes["fc8"] == (2, 7)
    vgg = models.build("vgg16", num_classes=5, image_size=64)
    assert vgg.shapes["conv1_2"] == (1, 64, 64, 64)
    assert vgg.shapes["pool5"] == (1, 512, 2, 2)
    assert vgg.shapes["fc8"] == (1, 5)


def test_layer_names():
    names = [n.name for n in models.build("alexnet", 10, 64).nodes]
    for expected in ("conv1", "relu1", "norm1", "pool1", "conv5", "pool5", "fc6", "drop6",
                     "fc8", "loss"):
        assert expected in names
    vgg_names = [n.name for n in models.build("vgg16", 10, 32).nodes]
    assert vgg_names[:3] == ["conv1_1", "relu1_1", "conv1_2"]
    assert "pool5" in vgg_names and "fc7" in vgg_names


@pytest.mark.parametrize("name,minimum", [("alexnet", 55), ("overfeat", 71), ("vgg16", 32),
                                          ("vgg116", 32)])
def test_too_small_images_name_the_minimum(name, minimum):
    assert models.min_image_size(name) == minimum
    models.build(name, num_classes=10, image_size=minimum)  # the minimum itself works
    with pytest.raises(ConfigError, match=rf"{name}.*image_size >= {minimum}"):
        models.build(name, num_classes=10, image_size=minimum - 1)


def test_unknown_names_and_bad_arguments():
    with pytest.raises(ConfigError, match="unknown model 'resnet51'.*alexnet"):
        models.build("resnet51")
    with pytest.raises(ConfigError, match="VGG depth must be 11, 13 or at least 16"):
        models.build("vgg14")
    with pytest.raises(ConfigError, match="num_classes"):
        models.build("alexnet", num_classes=0)
    with pytest.raises(ConfigError, match="image_size"):
        models.build("alexnet", image_size=-3)


def test_names_lists_the_paper_networks():
    names = models.names()
    for n in ("alexnet", "overfeat", "vgg16", "vgg116", "vgg216", "vgg316", "vgg416"):
        assert n in names
    for n in names:
        assert models.spec(n).native_image_size >= 32


def test_model_from_a_file(tmp_path):
    path = tmp_path / "mynet.py"
    path.write_text(
        "from minidnn import Network\n"
        "from minidnn.layers import Flatten, Linear, ReLU\n"
        "NATIVE_IMAGE_SIZE = 12\n"
        "def build(num_classes, image_size):\n"
        "    net = Network((3, image_size, image_size), num_classes=num_classes, name='mynet')\n"
        "    net.add(Flatten())\n"
        "    net.add(Linear(16), name='hidden')\n"
        "    net.add(ReLU())\n"
        "    net.add(Linear(num_classes), name='out')\n"
        "    return net\n")
    net = models.build(str(path), num_classes=4, image_size=8)
    assert net.nodes[-1].layer.kind == "loss"          # the loss is added for the file
    assert net.shapes["out"] == (1, 4)
    assert models.native_image_size(str(path)) == 12
    assert models.build(str(path), num_classes=3).shapes["hidden"] == (1, 16)


def test_model_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        models.build(str(tmp_path / "missing.py"))
    no_build = tmp_path / "nobuild.py"
    no_build.write_text("x = 1\n")
    with pytest.raises(ConfigError, match="nobuild.py.*must define build"):
        models.build(str(no_build))
    broken = tmp_path / "broken.py"
    broken.write_text("def build(num_classes, image_size):\n    return 1 / 0\n")
    with pytest.raises(ConfigError, match="broken.py.*ZeroDivisionError"):
        models.build(str(broken))
    syntax = tmp_path / "syntax.py"
    syntax.write_text("def build(:\n")
    with pytest.raises(ConfigError, match="syntax.py.*SyntaxError"):
        models.build(str(syntax))


def test_the_models_package_is_the_top_level_models_folder():
    """Run from a checkout, minidnn.models is the checkout's models/ (pyproject.toml installs
    the same folder as minidnn.models)."""
    from pathlib import Path
    import minidnn
    root = Path(minidnn.__file__).resolve().parent.parent
    assert Path(models.__file__).resolve() == root / "models" / "__init__.py"
    assert Path(models.resnet.__file__).resolve().parent == root / "models"
    setup = (root / "pyproject.toml").read_text()
    assert '"minidnn.models" = "models"' in setup
