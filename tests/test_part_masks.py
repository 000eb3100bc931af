"""Body-part masks: the union of chosen classes, grown, shrunk and feathered, against hand-made label maps;
the names and groups a model takes; the mask and cut-out files of a real run with tiny checkpoints."""

import json
import shutil

import numpy as np
import pytest
from PIL import Image

from sapiens2.data.metadata import body_parts, class_set
from sapiens2.errors import RequestError
from sapiens2.pipelines.segment import chosen_class_ids
from sapiens2.runtime.runtime import Runtime
from sapiens2.serving import handlers
from sapiens2.tasks import export_result
from sapiens2.tasks.registry import get_task
from sapiens2.vision.images import load_image
from sapiens2.vision.part_masks import feathered, grown, part_mask, union_mask

NAMES = body_parts().names


def ids(*names: str) -> list[int]:
    return [NAMES.index(name) for name in names]


def dot(shape=(7, 7), at=(3, 3)) -> np.ndarray:
    mask = np.zeros(shape, bool)
    mask[at] = True
    return mask


def test_the_union_of_the_chosen_classes():
    labels = np.array(
        [
            [0, 0, 3, 3, 0],
            [0, 6, 3, 3, 15],
            [0, 6, 0, 0, 15],
            [22, 22, 22, 22, 22],
        ]
    )
    hands = np.array(
        [
            [0, 0, 0, 0, 0],
            [0, 1, 0, 0, 1],
            [0, 1, 0, 0, 1],
            [0, 0, 0, 0, 0],
        ],
        bool,
    )
    np.testing.assert_array_equal(union_mask(labels, ids("Left_Hand", "Right_Hand")), hands)
    np.testing.assert_array_equal(
        union_mask(labels, ids("Left_Hand", "Right_Hand", "Torso")), hands | (labels == 22)
    )
    assert not union_mask(labels, []).any()


def test_grow_is_a_disc_of_that_radius():
    plus = np.zeros((7, 7), bool)
    plus[3, 2:5] = plus[2:5, 3] = True
    np.testing.assert_array_equal(grown(dot(), 1), plus)
    square = np.zeros((7, 7), bool)
    square[2:5, 2:5] = True
    np.testing.assert_array_equal(grown(dot(), 1.5), square)  # the diagonal neighbours are 1.41 away
    disc = square.copy()
    disc[3, [1, 5]] = disc[[1, 5], 3] = True
    np.testing.assert_array_equal(grown(dot(), 2), disc)  # 13 pixels: dx^2 + dy^2 <= 4
    np.testing.assert_array_equal(grown(dot(), 0), dot())


def test_shrink_is_the_same_disc_taken_away_and_the_photo_edge_does_not_shrink_a_mask():
    block = np.zeros((9, 9), bool)
    block[2:7, 2:7] = True
    inner = np.zeros((9, 9), bool)
    inner[3:6, 3:6] = True
    np.testing.assert_array_equal(grown(block, -1), inner)
    np.testing.assert_array_equal(grown(block, -1.5), inner)
    np.testing.assert_array_equal(grown(block, -2), dot((9, 9), (4, 4)))  # the centre is 3 from outside
    assert not grown(block, -3).any()
    edge = np.zeros((5, 5), bool)
    edge[:, :3] = True  # touches the left, top and bottom edges of the photo
    shrunk = np.zeros((5, 5), bool)
    shrunk[:, :2] = True
    np.testing.assert_array_equal(grown(edge, -1), shrunk)
    np.testing.assert_array_equal(grown(np.ones((4, 4), bool), -2), np.ones((4, 4), bool))


def test_feather_is_a_linear_ramp_that_wide_centred_on_the_edge():
    edge = np.zeros((3, 10), bool)
    edge[:, :5] = True
    row = [1, 1, 1, 0.875, 0.625, 0.375, 0.125, 0, 0, 0]
    np.testing.assert_allclose(feathered(edge, 4), np.tile(row, (3, 1)), atol=1e-6)
    assert feathered(edge, 4).sum() == pytest.approx(edge.sum())  # a straight edge keeps its area
    np.testing.assert_array_equal(feathered(edge, 0), edge.astype(np.float32))
    np.testing.assert_array_equal(feathered(edge, 1), edge.astype(np.float32))
    assert not feathered(np.zeros((3, 3), bool), 5).any() and feathered(np.ones((3, 3), bool), 5).all()


def test_part_mask_grows_then_feathers_and_is_uint8():
    labels = np.zeros((3, 10), np.uint8)
    labels[:, :4] = NAMES.index("Hair")
    mask = part_mask(labels, ids("Hair"), grow=1, feather=4)
    assert mask.dtype == np.uint8
    np.testing.assert_array_equal(mask[1], [255, 255, 255, 223, 159, 96, 32, 0, 0, 0])


def test_groups_and_names_become_class_ids():
    meta = body_parts()
    assert chosen_class_ids(["hands"], meta) == tuple(sorted(ids("Left_Hand", "Right_Hand")))
    assert chosen_class_ids(["whole person"], meta) == tuple(range(1, 29))
    assert chosen_class_ids(["face", "Hair"], meta) == tuple(
        sorted(ids("Face_Neck", "Hair", "Lower_Lip", "Upper_Lip", "Lower_Teeth", "Upper_Teeth", "Tongue"))
    )
    assert chosen_class_ids([], meta) == ()
    skin = chosen_class_ids(["skin"], meta)
    assert not set(skin) & set(chosen_class_ids(["clothing"], meta)) and ids("Torso")[0] in skin


def test_a_model_with_its_own_classes_takes_its_own_names():
    pets = class_set(["background", "cat", "dog"])
    assert chosen_class_ids(["dog"], pets) == (2,)
    assert chosen_class_ids(["whole person"], pets) == (1, 2)
    with pytest.raises(RequestError, match=r"no class 'face' nor any of its group.*background, cat, dog"):
        chosen_class_ids(["face"], pets)
    with pytest.raises(RequestError, match=r"no class 'Face_Neck'"):
        chosen_class_ids(["Face_Neck"], pets)


def test_the_parts_option_keeps_names_beyond_its_own_for_the_model_to_check():
    segment = get_task("segment")
    assert segment.coerce_options({})["parts"] == ("whole person",)
    assert segment.coerce_options({"parts": "Hair, hands"})["parts"] == ("hands", "Hair")
    assert segment.coerce_options({"parts": ["dog", "Hair", "dog"]})["parts"] == ("Hair", "dog")
    with pytest.raises(RequestError, match="Option 'parts'"):
        segment.coerce_options({"parts": 3})
    with pytest.raises(RequestError, match="Option 'grow'"):
        segment.coerce_options({"grow": 500})
    with pytest.raises(RequestError, match="Option 'feather'"):
        segment.coerce_options({"feather": -1})
    with pytest.raises(RequestError, match="keypoint_format"):  # other choices stay closed
        get_task("pose").coerce_options({"keypoint_format": ["dog"]})


# ---- a real run with tiny checkpoints ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def runtime(tiny_mirror):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SAPIENS2_CHECKPOINT_DIR", str(tiny_mirror))
        yield Runtime(device="cpu")


@pytest.fixture(scope="module")
def photo():
    return load_image("assets/astronaut.png")


def test_the_mask_and_the_cutout_files_hold_the_chosen_parts(runtime, photo, tmp_path):
    result = runtime.run("segment", photo, parts=["clothing", "Hair"], grow=3, feather=2)
    expected = part_mask(result.prediction.labels, chosen_class_ids(["clothing", "Hair"], body_parts()), 3, 2)
    files = {path.name.removeprefix("photo"): path for path in export_result(result, tmp_path, "photo")}
    with Image.open(files["_parts_mask.png"]) as image:
        assert image.mode == "L"
        np.testing.assert_array_equal(np.asarray(image), expected)
    with Image.open(files["_parts_cutout.png"]) as image:
        assert image.mode == "RGBA"
        cutout = np.asarray(image)
    np.testing.assert_array_equal(cutout[..., :3], photo.rgb)
    np.testing.assert_array_equal(cutout[..., 3], expected)
    pictures = dict(result.pictures)
    np.testing.assert_array_equal(pictures["Mask"], np.repeat(expected[..., None], 3, axis=2))
    assert pictures["Cut-out"].shape == photo.rgb.shape
    share = f"{expected.mean() / 255:.0%}"
    assert result.summary.endswith(f"Mask of clothing, Hair: {share} of the photo."), result.summary


def renamed_checkpoint(tiny_mirror, folder):
    """A copy of the tiny body-part checkpoint whose 29 classes are called part_0 ... part_28."""
    shutil.copytree(tiny_mirror / get_task("segment").repo_id(None), folder)
    config = json.loads((folder / "config.json").read_text())
    config["id2label"] = {str(i): f"part_{i}" for i in range(len(config["id2label"]))}
    config["label2id"] = {name: int(i) for i, name in config["id2label"].items()}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_a_fine_tuned_model_masks_by_its_own_class_names(runtime, photo, tiny_mirror, tmp_path):
    folder = renamed_checkpoint(tiny_mirror, tmp_path / "renamed")
    result = runtime.run("segment", photo, model=str(folder), parts=["part_3", "part_5"])
    mask = dict(result.pictures)["Mask"][..., 0]
    np.testing.assert_array_equal(mask, np.isin(result.prediction.labels, [3, 5]) * np.uint8(255))
    with pytest.raises(RequestError, match=r"no class 'Face_Neck'; choose among its classes \(part_0, "):
        runtime.run("segment", photo, model=str(folder), parts=["Face_Neck"])


def test_the_tab_lists_a_local_fine_tuned_models_own_names(runtime, tiny_mirror, tmp_path):
    folder = renamed_checkpoint(tiny_mirror, tmp_path / "renamed")
    (parts,) = [option for option in runtime.options("segment") if option.name == "parts"]
    refresh = handlers.choices_handler(runtime, parts, {"renamed": str(folder)})
    groups = ["whole person", "face", "hands", "clothing", "skin"]
    assert refresh("renamed")["choices"] == [*groups, *(f"part_{i}" for i in range(29))]
    assert refresh("0.4b")["choices"] == [*groups, *body_parts().names]
