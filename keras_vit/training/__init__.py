"""Pretraining and fine-tuning with plain `model.fit`, one step a function.

`train(PretrainConfig(...))` and `train(FinetuneConfig(...))` run a whole job
(the `keras-vit` command calls them). The steps they take are public and take
plain arguments, for scripts that write the loop out themselves, as
`examples/pretrain.py` and `examples/finetune.py` do:

    setup -> load_sources -> ViT (+ zero_head) -> pretraining_recipe / finetuning_recipe
    -> compile_model -> training_data -> make_callbacks -> model.fit -> check_finite
    -> model.evaluate -> save_run -> durable.finish -> report

Nothing is lost to a kill or a full disk: `keras_vit.training.durable` keeps the
training state until model.keras is written, and every file is written
under a temporary name and renamed into place.
"""

from keras_vit.configs import (  # noqa: F401 (public here too)
    SIZE_FIELDS,
    FinetuneConfig,
    PretrainConfig,
    check_sizes_agree,
    model_sizes,
    path_errors,
    raise_all,
)
from keras_vit.training.distillation import Distiller  # noqa: F401 (public here too)
from keras_vit.training.durable import backup_dir, resumed_epoch  # noqa: F401 (public here too)
from keras_vit.training.inputs import (  # noqa: F401 (public here)
    augmentation_defaults,
    evaluation_transform,
    fitted_batch_size,
    load_sources,
    pixel_statistics,
    training_data,
)
from keras_vit.training.model_setup import (  # noqa: F401 (public here)
    accuracy_metrics,
    compile_model,
    finetuning_recipe,
    precision,
    pretraining_recipe,
    setup,
    training_settings,
    update_steps,
    zero_head,
)
from keras_vit.training.run import check_inputs, train  # noqa: F401 (public here)
from keras_vit.training.run_outputs import (  # noqa: F401 (public here)
    check_finite,
    learning_curve,
    make_callbacks,
    optional_package,
    plot_learning_curve,
    report,
    save_run,
    tensorboard_callbacks,
)
