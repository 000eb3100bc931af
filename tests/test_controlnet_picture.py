"""The ControlNet pose picture: OpenPose's colours, on black, at the photo's size."""

import numpy as np

from sapiens2.data.metadata import keypoints308
from sapiens2.outputs.controlnet import openpose_picture
from sapiens2.vision.pose_decoding import Person

NAMES = keypoints308().names
INDEX = {name: i for i, name in enumerate(NAMES)}


def standing(scores: float = 0.9) -> Person:
    """Neck and shoulders far apart, a right hand whose wrist and thumb are placed, a nose tip."""
    keypoints = np.full((len(NAMES), 2), 5.0)
    places = {
        "neck": (200, 100), "right_shoulder": (100, 100), "left_shoulder": (300, 100),
        "right_wrist": (60, 300), "right_thumb_third_joint": (60, 340), "tip_of_nose": (200, 40),
    }  # fmt: skip
    present = np.zeros(len(NAMES))
    for name, place in places.items():
        keypoints[INDEX[name]] = place
        present[INDEX[name]] = scores
    return Person(np.array([40, 20, 300, 360]), keypoints, present, 0.9)


def test_limbs_joints_hands_and_face_in_openposes_colours():
    picture = openpose_picture((400, 360), [standing()], NAMES, threshold=0.3)
    assert picture.shape == (400, 360, 3) and picture.dtype == np.uint8
    # OpenPose's first limb (neck to right shoulder) is red, dimmed to 60 %; the right shoulder's joint is
    # orange at full strength; the left shoulder's limb is orange-red.
    assert picture[100, 150].tolist() == [153, 0, 0]
    assert picture[100, 100].tolist() == [255, 170, 0]
    assert picture[100, 250].tolist() == [153, 51, 0]
    assert picture[200, 200].tolist() == [0, 0, 0]  # black where nothing is drawn
    # The hand's first bone (wrist to the thumb's base) is red in OpenPose's hand colours; joints are blue.
    assert picture[320, 60].tolist() == [255, 0, 0]
    assert picture[340, 60].tolist() == [0, 0, 255]
    assert picture[40, 200].tolist() == [255, 255, 255]  # face points are white (the nose tip is 300-W's 30)


def test_points_below_the_threshold_are_not_drawn():
    assert not openpose_picture((400, 360), [standing(0.2)], NAMES, threshold=0.3).any()
    assert not openpose_picture((50, 60), [], NAMES, threshold=0.3).any()


def test_wild_coordinates_do_not_break_the_drawing():
    person = standing()
    person.keypoints[INDEX["right_shoulder"]] = (1e12, np.nan)
    picture = openpose_picture((400, 360), [person], NAMES, threshold=0.3)
    assert picture[100, 150].tolist() == [0, 0, 0] and picture[100, 250].tolist() == [153, 51, 0]
