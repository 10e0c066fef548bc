"""A small OpenEnv environment written with openenv-core's own server API, for tests of `--suite openenv:URL`.

Guess the number: reset(seed) picks a target from the seed (10 + 7 * seed mod 40) and asks for it as the sum of two
numbers; each step takes a guess and answers 'higher' or 'lower'; a right guess ends the episode with reward 1, the
third wrong one with reward 0.
Run as `python openenv_guess_env.py PORT`: openenv's `create_app` served by uvicorn on 127.0.0.1.
"""

from __future__ import annotations

import sys

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State


class GuessAction(Action):
    guess: int


class GuessObservation(Observation):
    prompt: str = ""
    hint: str = ""


def target_of(seed: int) -> int:
    return 10 + (7 * seed) % 40


class GuessEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id=None, step_count=0)
        self.target = 0

    def reset(self, seed: int | None = None, episode_id: str | None = None) -> GuessObservation:
        self.target = target_of(seed or 0)
        self._state = State(episode_id=episode_id, step_count=0)
        return GuessObservation(prompt=f"Guess the number: it is {self.target - 5} plus 5.", done=False, reward=0.0)

    def step(self, action: GuessAction, timeout_s: float | None = None) -> GuessObservation:
        self._state.step_count += 1
        if action.guess == self.target:
            return GuessObservation(hint="right", done=True, reward=1.0)
        over = self._state.step_count >= 3
        return GuessObservation(hint="higher" if action.guess < self.target else "lower", done=over, reward=0.0)

    @property
    def state(self) -> State:
        return self._state


app = create_app(GuessEnvironment, GuessAction, GuessObservation, env_name="guess", max_concurrent_envs=8)

if __name__ == "__main__":
    import uvicorn

    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
