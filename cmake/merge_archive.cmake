# Appends the members of archive ADD to archive OUT, with ar's MRI script
# (cmake -DAR=ar -DOUT=libprosody.a -DADD=librdkafka.a -P merge_archive.cmake).
file(WRITE ${OUT}.mri "open ${OUT}\naddlib ${ADD}\nsave\nend\n")
execute_process(COMMAND ${AR} -M INPUT_FILE ${OUT}.mri RESULT_VARIABLE rc)
file(REMOVE ${OUT}.mri)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "merging ${ADD} into ${OUT} failed")
endif()
