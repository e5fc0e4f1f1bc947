"""A rank that arms torch's FileTimerClient watchdog: rank 1 overruns a 1 s scope
(the server must kill it with SIGKILL), the others would sleep on."""
import os, signal, sys, time
import torch.distributed.elastic.timer as timer

client = timer.FileTimerClient(file_path=os.environ["TORCHELASTIC_TIMER_FILE"], signal=signal.SIGKILL)
timer.configure(client)
print("timer file", os.environ["TORCHELASTIC_TIMER_FILE"], flush=True)
if os.environ["RANK"] == "1":
    with timer.expires(after=1, scope="stuck_step"):
        time.sleep(60)
time.sleep(float(os.environ.get("OTHERS_SLEEP", "60")))
