"""One module per task: photos in, TaskResults (pictures, prediction, exports) out."""
