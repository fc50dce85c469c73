"""Test double of modules.ui_image_generation: the Image tab's generate(), as the web UI's own
API (modules/api/images.py) drives it with save_images=False.

Follows the host's generate(state, save_images=True): it yields ``(images, progress_html)``, the
last yield holding every image (PIL images when save_images is False); an unselected model
('None') or a model that fails to load is logged and yields ``[]``; the seed -1 is resolved into
``state['image_seed_resolved']``; ``shared.stop_everything`` is reset at the start and checked
between batches and at each step (the pipeline's callback); each batch calls
``shared.image_model(**gen_kwargs)`` with the host's keywords (``guidance_scale``, or
``true_cfg_scale`` for qwenimage) and reads ``.images``; any failure is logged ("Image generation
failed") and yields ``[]``. The torch generator, the progress thread and clear_torch_cache are not
modelled.
"""

import random
import types

from modules import shared
from modules.logging_colors import logger

CALLS = []   # (state, save_images) of each call


class Generator:
    """Stands in for torch.Generator."""

    def __init__(self, device="cpu"):
        self.seed = None

    def manual_seed(self, seed):
        self.seed = seed
        return self


class ImagePipeline:
    """Stands in for a loaded diffusers pipeline: one flat-coloured PIL image per image asked
    for, its colour from the generator's seed. ``fail`` makes a call raise, as a pipeline out of
    memory would."""

    def __init__(self, fail=None):
        self.calls = []
        self.fail = fail

    def __call__(self, **kw):
        from PIL import Image

        self.calls.append(kw)
        if self.fail is not None:
            raise self.fail
        for step in range(kw["num_inference_steps"]):
            kw["callback_on_step_end"](self, step, 0, {})
        seed = kw["generator"].seed
        images = [Image.new("RGB", (kw["width"], kw["height"]), ((seed + i) % 256, 0, 0))
                  for i in range(kw["num_images_per_prompt"])]
        return types.SimpleNamespace(images=images)


def progress_bar_html(progress=0, text=""):
    return "" if progress <= 0 else f"<div>{progress:.2f} {text}</div>"


def load_image_model(model_name, **kw):
    """The double loads nothing: as the host's when the model cannot be loaded."""
    return None


def generate(state, save_images=True):
    CALLS.append((dict(state), save_images))
    try:
        model_name = state['image_model_menu']
        if not model_name or model_name == 'None':
            logger.error("No image model selected. Go to the Model tab and select a model.")
            yield [], progress_bar_html()
            return
        if shared.image_model is None:
            result = load_image_model(model_name, dtype=state['image_dtype'], attn_backend=state['image_attn_backend'],
                                      cpu_offload=state['image_cpu_offload'], compile_model=state['image_compile'],
                                      quant_method=state['image_quant'])
            if result is None:
                logger.error(f"Failed to load model `{model_name}`.")
                yield [], progress_bar_html()
                return
            shared.image_model_name = model_name

        seed = state['image_seed']
        if seed == -1:
            seed = random.randint(0, 2**32 - 1)
        state['image_seed_resolved'] = seed
        generator = Generator("cpu")
        all_images = []
        pipeline_type = getattr(shared, 'image_pipeline_type', None) or 'zimage'
        shared.stop_everything = False
        batch_count = int(state['image_batch_count'])

        def interrupt_callback(pipe, step_index, timestep, callback_kwargs):
            if shared.stop_everything:
                pipe._interrupt = True
            return callback_kwargs

        gen_kwargs = {
            "prompt": state['image_prompt'],
            "negative_prompt": state['image_neg_prompt'],
            "height": int(state['image_height']),
            "width": int(state['image_width']),
            "num_inference_steps": int(state['image_steps']),
            "num_images_per_prompt": int(state['image_batch_size']),
            "generator": generator,
            "callback_on_step_end": interrupt_callback,
        }
        cfg_val = state.get('image_cfg_scale', 0.0)
        if pipeline_type == 'qwenimage':
            gen_kwargs["true_cfg_scale"] = cfg_val
        else:
            gen_kwargs["guidance_scale"] = cfg_val

        for batch_idx in range(batch_count):
            if shared.stop_everything:
                break
            generator.manual_seed(int(seed + batch_idx))
            result = shared.image_model(**gen_kwargs).images
            if save_images:
                raise NotImplementedError("the double does not save images (the host's API passes save_images=False)")
            all_images.extend(result)
            yield all_images, progress_bar_html((batch_idx + 1) / batch_count, f"Batch {batch_idx + 1}/{batch_count}")

        yield all_images, progress_bar_html()
    except Exception:  # noqa: BLE001 - as the web UI does: logged, not raised
        logger.exception("Image generation failed")
        yield [], progress_bar_html()
