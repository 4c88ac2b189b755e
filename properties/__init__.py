"""The plans: what a run will do, as pure data.  ``plan`` holds the plan and its JSON codec, ``generate``
makes one from a scenario and seed, ``reduction`` makes the smaller candidate plans ``ordeal shrink`` tries."""
