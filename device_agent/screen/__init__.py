"""The device's screen beyond the model's tools: live view frames, forwarded input, recordings.

- `source`: where frames come from and input goes (the X11 display, or the browser server);
- `leases`: which view streams are on, and when each is due its next frame (pure, clocked);
- `inputs`: a person's forwarded input, taken only while the device is taken over;
- `recorder`: recordings of attempts, encoded with ffmpeg and uploaded as artifacts;
- `hub`: the one object the agent talks to.
"""
