"""Videos from Python under their documented name (README, "Command line"): `VideoJob`, `process_video`
and what they use live in the batch engine, `sapiens2.batch.video`."""

from sapiens2.batch.video import VideoInfo, VideoJob, VideoResult, process_video, video_info

__all__ = ["VideoInfo", "VideoJob", "VideoResult", "process_video", "video_info"]
