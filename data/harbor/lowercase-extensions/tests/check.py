# The checks of this task; test.sh turns their outcome into the reward.
import os
got = sorted(os.listdir("/app/photos"))
assert got == sorted(["IMG_001.jpg", "IMG_002.jpg", "Beach Day.jpg", "notes.txt"]), got
assert open("/app/photos/Beach Day.jpg").read() == "c\n"
